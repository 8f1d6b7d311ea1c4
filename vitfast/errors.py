"""User-facing errors.

Every error a user can cause (bad config, bad checkpoint, bad input) is a `VitfastError`; the CLI
prints its message as one line and exits 2. Each also subclasses the builtin a Python caller
would expect (`ValueError`, ...), so `except ValueError` keeps working.
"""


class VitfastError(Exception):
    """Base class: a problem the user can fix; the message says what and how."""


class ConfigError(VitfastError, ValueError):
    """An invalid model configuration or an unknown model name."""


class CheckpointError(VitfastError, ValueError):
    """A checkpoint that cannot be read, is unsafe, or does not fit the model."""


class InputError(VitfastError, ValueError):
    """Images of the wrong shape, dtype or channel count."""


class ArtifactError(VitfastError, ValueError):
    """An export artifact (ONNX file, engine, sidecar) that is missing, corrupt or incompatible."""


class BackendUnavailable(VitfastError, RuntimeError):
    """An optional backend (onnxruntime, TensorRT, a GPU) is not installed or not present."""


class VitfastWarning(UserWarning):
    """Base class: something the user should know that does not stop the work; the CLI prints it as one line."""


class ParityWarning(VitfastWarning):
    """An artifact whose parity check failed, or was recorded as failed at export: it is kept for inspection, and its
    sidecar records the numbers."""


class GuessedConfigWarning(VitfastWarning):
    """A checkpoint did not store part of its config (head count, preprocessing, ...) and vitfast guessed it."""


class OutputError(ArtifactError, OSError):
    """An output that cannot be written: it exists, another process is writing it, or its folder is
    missing, read-only, full or a file."""


def first_line(exc: BaseException) -> str:
    """A library exception's first message line (at most 200 characters), or its type's name: what
    a one-line error quotes of it."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def describe_exception(exc: BaseException) -> str:
    """`Type: first line of the message` (the type alone when there is no message), for a report
    that records a failure and goes on."""
    return f"{type(exc).__name__}: {first_line(exc)}" if str(exc).strip() else type(exc).__name__
