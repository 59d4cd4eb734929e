"""The protobuf wire-format helpers that add CUBINs to jaxlib's calls."""

from __future__ import annotations

import random
import unittest

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import _compat
from jt_dist._gpu import proto_wire as wire
from jt_dist import testing
import gpu_lowering_util as util


def _varint_field(number: int, value: int) -> bytes:
  return wire.encode_varint(number << 3) + wire.encode_varint(value)


def _image(seed: int) -> wire.ModuleImage:
  rng = random.Random(seed)
  return wire.ModuleImage(f"kernel_{seed}", rng.randrange(1, 1 << 17),
                          bytes(rng.randrange(256) for _ in range(300)))


def _kernel_call(name: str, grid_x: int) -> bytes:
  kernel = wire.length_delimited(1, name.encode()) + _varint_field(2, 4)
  return wire.length_delimited(1, kernel) + _varint_field(2, grid_x)


class VarintTest(testing.TestCase):

  @parameterized.parameters(0, 1, 127, 128, 300, 2**31, 2**63 - 1, 2**64 - 1)
  def test_round_trip(self, value):
    field = wire.parse_fields(_varint_field(3, value))[0]
    self.assertEqual((field.number, field.value()), (3, value))

  def test_negative_is_refused(self):
    with self.assertRaisesRegex(ValueError, "-5 is negative"):
      wire.encode_varint(-5)


class ParseFieldsTest(testing.TestCase):

  def test_fields_join_back_to_the_message(self):
    message = (_varint_field(1, 7) + wire.length_delimited(2, b"abc")
               + (3 << 3 | 5).to_bytes(1, "little") + b"\x01\x02\x03\x04"
               + (4 << 3 | 1).to_bytes(1, "little") + bytes(range(8)))
    fields = wire.parse_fields(message)
    self.assertEqual([f.number for f in fields], [1, 2, 3, 4])
    self.assertEqual(fields[1].value(), b"abc")
    self.assertEqual(b"".join(f.raw for f in fields), message)

  @parameterized.named_parameters(
      ("truncated_varint", b"\x08\x80"),
      ("length_past_the_end", b"\x12\x05ab"),
      ("group_wire_type", b"\x0b"),
      ("field_zero", b"\x00\x01"),
      ("fixed32_cut", b"\x1d\x01\x02"),
  )
  def test_malformed_bytes_raise(self, data):
    with self.assertRaises(ValueError):
      wire.parse_fields(data)


class WithModuleImagesTest(testing.TestCase):

  def test_single_call_gets_the_image_and_keeps_other_fields(self):
    call = _kernel_call("k", 9)
    message = (wire.length_delimited(1, call)
               + wire.length_delimited(3, b"metadata")
               + wire.length_delimited(4, b"name"))
    image = _image(1)
    patched = wire.with_module_images(message, [image])
    decoded = util.decode_any_call(patched)
    self.assertEqual(decoded["name"], "name")
    self.assertEqual(decoded["metadata"], b"metadata")
    (kernel,) = decoded["calls"]
    self.assertEqual(kernel["name"], "k")
    self.assertEqual(kernel["grid"], (9, 0, 0))
    self.assertEqual(kernel["module_image"], {
        "object_file": image.object_file, "kernel_name": image.kernel_name,
        "shared_mem": image.shared_mem_bytes})

  def _autotuned(self, num_configs: int) -> bytes:
    tuned = wire.length_delimited(1, b"tuning name")
    for i in range(num_configs):
      config = (wire.length_delimited(1, _kernel_call(f"k{i}", i + 1))
                + wire.length_delimited(2, f"config {i}".encode()))
      tuned += wire.length_delimited(2, config)
    tuned += wire.length_delimited(3, _varint_field(1, 0) + _varint_field(3, 64))
    return wire.length_delimited(2, tuned) + wire.length_delimited(4, b"n")

  def test_each_autotuning_config_gets_its_own_image(self):
    images = [_image(seed) for seed in range(3)]
    decoded = util.decode_any_call(
        wire.with_module_images(self._autotuned(3), images))
    self.assertEqual(decoded["descriptions"],
                     ["config 0", "config 1", "config 2"])
    self.assertEqual([c["name"] for c in decoded["calls"]], ["k0", "k1", "k2"])
    self.assertEqual([c["module_image"]["object_file"]
                      for c in decoded["calls"]],
                     [i.object_file for i in images])
    self.assertEqual(decoded["aliases"], [(0, 0, 64)])
    self.assertEqual(decoded["tuning_name"], "tuning name")

  def test_image_count_must_match_configs(self):
    with self.assertRaisesRegex(ValueError, "3 configs, but 2 module images"):
      wire.with_module_images(self._autotuned(3), [_image(0), _image(1)])
    with self.assertRaisesRegex(ValueError, "takes 1 image, not 2"):
      wire.with_module_images(wire.length_delimited(1, _kernel_call("k", 1)),
                              [_image(0), _image(1)])

  def test_bytes_without_a_kernel_call_raise(self):
    with self.assertRaisesRegex(ValueError, "no Triton kernel call"):
      wire.with_module_images(wire.length_delimited(4, b"n"), [_image(0)])


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class JaxlibProtoTest(testing.TestCase):
  """The helpers on what jaxlib's own protobuf library serialises."""

  def test_parse_and_patch_jaxlib_output(self):
    lib = _compat.gpu_triton_module()._cuda_triton  # pylint: disable=protected-access
    kernel = lib.TritonKernel("kern", 4, 1, 1024, "// ptx", "// ttir", 90)
    params = [lib.create_array_parameter(0, 16),
              lib.create_scalar_parameter(5, "i32")]
    call = lib.TritonKernelCall(kernel, 3, 2, 1, params)
    serialized = call.to_proto("my call", b"meta")
    self.assertEqual(
        b"".join(f.raw for f in wire.parse_fields(serialized)), serialized)
    image = _image(7)
    decoded = util.decode_any_call(wire.with_module_images(serialized, [image]))
    (kernel_call,) = decoded["calls"]
    self.assertEqual(kernel_call["ptx"], "// ptx")
    self.assertEqual(kernel_call["grid"], (3, 2, 1))
    self.assertEqual(kernel_call["params"], [("array", 0, 16), ("i32", 5)])
    self.assertEqual(kernel_call["module_image"]["object_file"],
                     image.object_file)


if __name__ == "__main__":
  absltest.main()
