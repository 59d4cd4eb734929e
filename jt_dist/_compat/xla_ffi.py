"""The XLA FFI C API's structs as ctypes mirrors (xla/ffi/api/c_api.h), for
the CPU target's trampoline. Their layout is one in FFI API 0.3 (jaxlib
0.10.2) and 0.5 (jaxlib 0.12); XLA only appends fields within major 0, so a
frame of another major or a smaller size is refused, not read.
"""

import ctypes

_P = ctypes.c_void_p


class ExtensionBase(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
              ("next", _P)]


class ApiVersion(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _P),
              ("major_version", ctypes.c_int),
              ("minor_version", ctypes.c_int)]


class Metadata(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", ApiVersion),
              ("traits", ctypes.c_uint32), ("state_type_id", ctypes.c_int64)]


class MetadataExtension(ctypes.Structure):
  _fields_ = [("extension_base", ExtensionBase),
              ("metadata", ctypes.POINTER(Metadata))]


class ByteSpan(ctypes.Structure):
  _fields_ = [("ptr", _P), ("len", ctypes.c_size_t)]


class Scalar(ctypes.Structure):
  _fields_ = [("dtype", ctypes.c_int), ("value", _P)]


class Buffer(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _P),
              ("dtype", ctypes.c_int), ("data", _P),
              ("rank", ctypes.c_int64),
              ("dims", ctypes.POINTER(ctypes.c_int64))]


class Operands(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets alike
  _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _P),
              ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
              ("items", ctypes.POINTER(_P))]


class Attrs(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _P),
              ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
              ("names", ctypes.POINTER(ctypes.POINTER(ByteSpan))),
              ("attrs", ctypes.POINTER(_P))]


class CallFrame(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t),
              ("extension_start", ctypes.POINTER(ExtensionBase)),
              ("api", _P), ("ctx", _P), ("stage", ctypes.c_int),
              ("args", Operands), ("rets", Operands), ("attrs", Attrs),
              ("future", _P)]


class ErrorCreateArgs(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _P),
              ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


ERROR_CREATE = ctypes.CFUNCTYPE(_P, ctypes.POINTER(ErrorCreateArgs))


class ApiHead(ctypes.Structure):
  """``XLA_FFI_Api`` up to its first function pointer, ``Error_Create``."""
  _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _P),
              ("api_version", ApiVersion), ("internal_api", _P),
              ("Error_Create", ERROR_CREATE)]


def _struct_size(cls, last_field):
  # XLA_FFI_STRUCT_SIZE(type, last_field): the size up to that field's end.
  field = getattr(cls, last_field)
  return field.offset + field.size


API_VERSION_SIZE = _struct_size(ApiVersion, "minor_version")
ERROR_CREATE_ARGS_SIZE = _struct_size(ErrorCreateArgs, "errc")
# The smallest call frame holding every field read here (through attrs).
MIN_CALL_FRAME_SIZE = _struct_size(CallFrame, "attrs")
MIN_API_SIZE = _struct_size(ApiHead, "Error_Create")

EXTENSION_METADATA = 1
STAGE_EXECUTE = 3
TYPE_BUFFER = 1
ATTR_SCALAR = 3
DTYPE_U64 = 9
ERRC_UNKNOWN = 2
ERRC_INVALID_ARGUMENT = 3
# The FFI API version the handler claims: the oldest XLA accepts (it accepts
# 0.1 up to its own XLA_FFI_API_MAJOR.MINOR).
CLAIMED_API = (0, 1)

HANDLER = ctypes.CFUNCTYPE(_P, ctypes.POINTER(CallFrame))


def _api(address: int) -> ApiHead | None:
  """The API table at ``address`` if it has the layout mirrored here."""
  if not address:
    return None
  api = ApiHead.from_address(address)
  if api.api_version.major_version != 0 or api.struct_size < MIN_API_SIZE:
    return None
  return api


def frame_is_readable(frame: CallFrame) -> bool:
  """Whether ``frame`` and its API table have the layout mirrored here."""
  return (frame.struct_size >= MIN_CALL_FRAME_SIZE
          and _api(frame.api) is not None)


def answer_metadata(frame: CallFrame) -> bool:
  """Answers XLA's metadata query, if ``frame`` is one; returns whether.
  Against another major version it claims 0.0: XLA refuses registration."""
  ext = frame.extension_start
  if not ext or ext.contents.type != EXTENSION_METADATA:
    return False
  metadata = ctypes.cast(ext, ctypes.POINTER(MetadataExtension)).contents
  version = metadata.metadata.contents.api_version
  version.struct_size = API_VERSION_SIZE
  version.extension_start = None
  # Some XLA versions pass no API table with the metadata query.
  known = (not frame.api
           or ApiHead.from_address(frame.api).api_version.major_version == 0)
  version.major_version, version.minor_version = (
      CLAIMED_API if known else (0, 0))
  metadata.metadata.contents.traits = 0
  return True


def make_error(api_address: int, message: str, errc: int = ERRC_UNKNOWN):
  """An ``XLA_FFI_Error*`` with ``message`` (XLA copies it), or None where
  there is no API table, or it lacks the layout mirrored here (another
  major version's)."""
  if (api := _api(api_address)) is None:
    return None
  args = ErrorCreateArgs(ERROR_CREATE_ARGS_SIZE, None,
                         message.encode("utf-8", "replace"), errc)
  return api.Error_Create(ctypes.byref(args))
