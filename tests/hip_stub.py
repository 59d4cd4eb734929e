"""A stand-in HIP runtime, so that JAX's ROCm plugin loads on a CPU host.

The Triton bindings of JAX's ROCm plugin (``jax_rocm<N>_plugin._triton``)
link ``libamdhip64.so.7``, which comes with ROCm, not with the plugin's
wheel. Lowering a call never runs HIP code, so on a host without ROCm the
tests load a stub library of that name before JAX is imported: the dynamic
linker then satisfies the plugin's dependency with it.

The stub does more than satisfy the linker: it records what jaxlib's
legacy Triton custom call hands to HIP when it is invoked directly
(``launch_legacy_call``), which module image it loads, which kernel it
looks up, and the grid, block size, shared memory and memsets of the
launch. That is what jaxlib would do on an AMD GPU, short of the GPU.
Every function returns success; no memory is touched, except by the
memset and copy functions, which the tests never reach.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zlib

SONAME = "libamdhip64.so.7"
# The plugins jaxlib looks for, newest ROCm first (jaxlib/plugin_support.py).
PLUGIN_MODULES = ("jax_rocm10_plugin", "jax_rocm7_plugin", "jax_rocm60_plugin")

# The symbol versions the plugin's _triton.so binds (objdump -T); the rest
# of its HIP functions are hip_4.2's.
_VERSIONS = {
    "hip_4.2": ("*",),
    "hip_4.3": ("hipStreamIsCapturing",),
    "hip_5.1": ("hipMallocAsync", "hipFreeAsync"),
    "hip_6.0": ("hipGetDevicePropertiesR0600",),
}

_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int hipError_t;

static unsigned char g_image[1 << 22];
static size_t g_image_size;
static char g_name[256];
static unsigned g_launch[7];
static int g_launches;
static size_t g_memset_bytes;
static int g_memsets;

/* An ELF image's size: its section headers end it (as lld lays HSACO out). */
static size_t elf_size(const unsigned char *p) {
  uint64_t shoff; uint16_t shentsize, shnum;
  if (memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return 0;
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  return (size_t)(shoff + (uint64_t)shentsize * shnum);
}

hipError_t hipInit(unsigned flags) { return 0; }
const char *hipGetErrorString(hipError_t e) { return "jt_dist HIP stub"; }
int hipGetStreamDeviceId(void *stream) { return 0; }
hipError_t hipDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
hipError_t hipDevicePrimaryCtxRetain(void **ctx, int device) {
  *ctx = (void *)0x1000; return 0;
}
hipError_t hipCtxPushCurrent(void *ctx) { return 0; }
hipError_t hipCtxPopCurrent(void **ctx) { if (ctx) *ctx = (void *)0x1000; return 0; }
hipError_t hipCtxGetDevice(int *device) { *device = 0; return 0; }
hipError_t hipDeviceGetAttribute(int *value, int attr, int device) {
  *value = 65536; return 0;
}
hipError_t hipGetDevicePropertiesR0600(void *prop, int device) { return 100; }
hipError_t hipModuleLoadData(void **module, const void *image) {
  size_t n = elf_size((const unsigned char *)image);
  if (n == 0 || n > sizeof g_image) return 200;  /* hipErrorInvalidImage */
  memcpy(g_image, image, n);
  g_image_size = n;
  *module = (void *)0x2000;
  return 0;
}
hipError_t hipModuleGetFunction(void **function, void *module, const char *name) {
  strncpy(g_name, name, sizeof g_name - 1);
  *function = (void *)0x3000;
  return 0;
}
hipError_t hipModuleUnload(void *module) { return 0; }
hipError_t hipFuncGetAttribute(int *value, int attr, void *function) {
  *value = 0; return 0;
}
hipError_t hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz,
                                 unsigned shared, void *stream, void **params,
                                 void **extra) {
  unsigned v[7] = {gx, gy, gz, bx, by, bz, shared};
  memcpy(g_launch, v, sizeof v);
  g_launches++;
  return 0;
}
hipError_t hipMemsetD8Async(void *dst, unsigned char value, size_t n, void *s) {
  g_memset_bytes += n; g_memsets++; return 0;
}
hipError_t hipMallocAsync(void **p, size_t n, void *s) { *p = (void *)0x4000; return 0; }
hipError_t hipFreeAsync(void *p, void *s) { return 0; }
hipError_t hipStreamIsCapturing(void *s, int *status) { *status = 0; return 0; }
hipError_t hipMemcpyDtoHAsync(void *d, void *s, size_t n, void *st) { return 0; }
hipError_t hipMemcpyHtoDAsync(void *d, void *s, size_t n, void *st) { return 0; }
hipError_t hipStreamSynchronize(void *s) { return 0; }
hipError_t hipEventCreateWithFlags(void **e, unsigned flags) { *e = (void *)0x5000; return 0; }
hipError_t hipEventRecord(void *e, void *s) { return 0; }
hipError_t hipEventSynchronize(void *e) { return 0; }
hipError_t hipEventElapsedTime(float *ms, void *a, void *b) { *ms = 1.0f; return 0; }
hipError_t hipEventDestroy(void *e) { return 0; }

/* For the tests: what the last launch did. */
void jt_stub_reset(void) {
  g_image_size = 0; g_name[0] = 0; g_launches = 0; g_memsets = 0;
  g_memset_bytes = 0; memset(g_launch, 0, sizeof g_launch);
}
size_t jt_stub_image(const unsigned char **data) { *data = g_image; return g_image_size; }
const char *jt_stub_kernel_name(void) { return g_name; }
int jt_stub_launch(unsigned *out) { memcpy(out, g_launch, sizeof g_launch); return g_launches; }
size_t jt_stub_memset_bytes(int *count) { *count = g_memsets; return g_memset_bytes; }
"""


def _version_script() -> str:
  nodes, previous = [], None
  for version, symbols in _VERSIONS.items():
    parent = f" {previous}" if previous else ""
    names = " ".join(f"{name};" for name in symbols)
    nodes.append(f"{version} {{ global: {names} }}{parent};")
    previous = version
  return "\n".join(nodes) + "\n"


def plugin_installed() -> str | None:
  """The name of the installed ROCm plugin module, or None."""
  for name in PLUGIN_MODULES:
    if importlib.util.find_spec(name) is not None:
      return name
  return None


def _build(folder: str) -> str | None:
  compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
  if compiler is None:
    return None
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, SONAME)
  if os.path.exists(path):
    return path
  with tempfile.TemporaryDirectory(dir=folder) as work:
    source = os.path.join(work, "hip_stub.c")
    script = os.path.join(work, "hip_stub.map")
    with open(source, "w") as f:
      f.write(_SOURCE)
    with open(script, "w") as f:
      f.write(_version_script())
    built = os.path.join(work, SONAME)
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{SONAME}",
         f"-Wl,--version-script={script}", "-o", built, source],
        capture_output=True, text=True, check=False)
    if result.returncode:
      return None
    os.replace(built, path)
  return path


_loaded: str | None = None
STATUS = "not tried"


def load_if_needed() -> None:
  """Loads the stub where a ROCm plugin is installed and HIP is missing.

  Must run before JAX is imported (jaxlib imports the plugin then). Sets
  ``STATUS`` to what happened, for the tests' skip reasons.
  """
  global _loaded, STATUS
  plugin = plugin_installed()
  if plugin is None:
    STATUS = "no ROCm plugin"
    return
  try:
    ctypes.CDLL(SONAME)
    STATUS = "the real HIP runtime"
    return
  except OSError:
    pass
  try:
    importlib.import_module(f"{plugin}._triton")
    STATUS = "the real HIP runtime (found by the plugin)"
    return
  except ImportError:
    pass
  digest = hashlib.sha256(
      (_SOURCE + _version_script()).encode()).hexdigest()[:16]
  root = os.environ.get("JT_DIST_CACHE_DIR") or tempfile.gettempdir()
  path = _build(os.path.join(root, f"hip_stub-{os.getuid()}-{digest}"))
  if path is None:
    STATUS = ("no C compiler (cc) to build the stub HIP runtime that the"
              f" ROCm plugin's {SONAME} dependency needs on a host without ROCm")
    return
  ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
  _loaded = path
  STATUS = "stub"


def stub_path() -> str | None:
  """The stub library's path where it was loaded, for subprocesses."""
  return _loaded


@dataclasses.dataclass(frozen=True)
class Launch:
  """What jaxlib's call handed to HIP."""

  image: bytes
  kernel_name: str
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  shared_mem: int
  launches: int
  memsets: int
  memset_bytes: int


def _stub():
  if _loaded is None:
    raise RuntimeError("the HIP stub is not loaded (a real HIP runtime is)")
  return ctypes.CDLL(_loaded)


def launch_legacy_call(plugin_module, opaque: bytes, num_buffers: int
                       ) -> Launch:
  """Runs jaxlib's legacy ROCm Triton call on the stub; returns its launch.

  Args:
    plugin_module: jaxlib's ROCm Triton bindings (``gpu_triton._hip_triton``).
    opaque: the custom call's backend config (the compressed proto).
    num_buffers: operands plus results.

  Raises:
    RuntimeError: jaxlib reported an error (its message included).
  """
  lib = _stub()
  lib.jt_stub_reset()
  capsule = plugin_module.get_custom_call()
  get_name = ctypes.pythonapi.PyCapsule_GetName
  get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
  get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
  get_pointer.restype = ctypes.c_void_p
  get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
  address = get_pointer(capsule, get_name(capsule))
  function = ctypes.CFUNCTYPE(
      None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
      ctypes.c_size_t, ctypes.c_void_p)(address)
  # Fake, 256-byte aligned device addresses: jaxlib checks the alignment
  # each pointer parameter was specialised for.
  buffers = (ctypes.c_void_p * num_buffers)(
      *[0x10000 * (i + 1) for i in range(num_buffers)])
  # XlaCustomCallStatus: an optional std::string, set on failure.
  status = ctypes.create_string_buffer(64)
  function(None, buffers, opaque, len(opaque), ctypes.addressof(status))
  if status.raw[32]:  # The optional holds a message.
    raise RuntimeError(f"jaxlib's call failed: {_status_message(status)}")
  data = ctypes.POINTER(ctypes.c_ubyte)()
  lib.jt_stub_image.restype = ctypes.c_size_t
  size = lib.jt_stub_image(ctypes.byref(data))
  launch = (ctypes.c_uint * 7)()
  count = lib.jt_stub_launch(launch)
  memsets = ctypes.c_int()
  lib.jt_stub_memset_bytes.restype = ctypes.c_size_t
  memset_bytes = lib.jt_stub_memset_bytes(ctypes.byref(memsets))
  lib.jt_stub_kernel_name.restype = ctypes.c_char_p
  return Launch(
      image=ctypes.string_at(data, size),
      kernel_name=lib.jt_stub_kernel_name().decode(),
      grid=tuple(launch[:3]), block=tuple(launch[3:6]), shared_mem=launch[6],
      launches=count, memsets=memsets.value, memset_bytes=memset_bytes)


def _status_message(status) -> str:
  # libstdc++'s std::string: data pointer, then size; the optional's flag
  # follows the 32-byte string.
  pointer = int.from_bytes(status.raw[:8], "little")
  size = int.from_bytes(status.raw[8:16], "little")
  if not pointer or size > 1 << 16:
    return "(unreadable status)"
  return ctypes.string_at(pointer, size).decode(errors="replace")


def decompressed(opaque: bytes) -> bytes:
  """The serialised call in a Triton custom call's backend config."""
  return zlib.decompress(opaque)
