"""Request checks inside Triton's python-backend stub, in front of PyTriton's proxy model.

`vitfast serve` sends this file to Triton as each model's `model.py`, with PyTriton's own proxy
model beside it as `pytriton_model.py` (see `vitfast.serve._install_guard`). It exists because
PyTriton has no way to fail one request of a batch with a plain message: anything raised on the
way (in its tensor transport, or in vitfast's inference callable) fails every request the dynamic
batcher grouped with it, and the client gets a Python traceback as the error text. Here each
request is checked on its own; a bad one gets its own one-line error (INVALID_ARG: HTTP 400,
gRPC INVALID_ARGUMENT) and the others in the batch are served as usual. What Triton itself
checks first (dtype, fixed dimensions, batch size, the byte count) never gets this far.

Checks: an empty batch or a dimension of size 0 (an image with no pixels: PyTriton's shared-memory
transport cannot carry it), NaN or infinite values in float inputs (the logits would be NaN and
the top-k meaningless), and, for a model that takes any image size (dynamic_img_size), float images
that are not whole patches or lie outside a TensorRT engine's image sizes (the engine would refuse the whole
batch they came in). An unexpected failure further on becomes one line per request too, with
the full text in the server log (`vitfast serve --verbose` shows it).

Runs in the stub process: numpy and the standard library only, no vitfast import.
"""

import json
import re

import numpy as np

ALLOW_NONFINITE = False  # `vitfast serve --allow-nonfinite` ships this file with True here
PATCH_SIZE = None  # a dynamic_img_size model is shipped with its patch size here: float H, W must be multiples of it
SIZE_RANGE = None  # ... and a TensorRT engine's profile ends here, ((min H, min W), (max H, max W))
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.+)$")


def describe(dtype, dims, channels_last):
    """The expected shape in words, e.g. "uint8 images [B, H, W, 3]" for config dims [-1, -1, 3]: a -1 is named by its
    position ([3, -1, -1] is [B, 3, H, W]), N where the dims are not those of an image."""
    names = (["H", "W", "C"] if channels_last else ["C", "H", "W"]) if len(dims) == 3 else ["N"] * len(dims)
    shape = ", ".join(["B"] + [name if d < 0 else str(d) for name, d in zip(names, dims)])
    return f"{dtype} images [{shape}]"


def find_problem(model, name, array, dims, patch=None, sizes=None):
    """Why this request's input cannot be served (one line: the problem, then the fix), or None.

    `dims` are the input's dimensions in the model config, without the batch axis (-1 = any size);
    `patch`: the H and W of float [B, C, H, W] images must be whole patches of this size; `sizes`:
    ((min H, min W), (max H, max W)) they must lie between.
    """
    dtype = np.dtype(array.dtype).name
    channels_last = dtype == "uint8"
    expected = describe(dtype, dims, channels_last)
    shape = list(array.shape)
    if not shape or shape[0] == 0:
        return f"empty batch: input '{name}' of model '{model}' has shape {shape}; send at least one image, {expected} with B >= 1"
    if 0 in shape[1:]:
        nonzero = "H, W >= 1" if channels_last else "every dimension >= 1"
        return (f"empty image: input '{name}' of model '{model}' has shape {shape}, which holds no pixels; "
                f"send {expected} with {nonzero}")  # fmt: skip
    if patch and not channels_last and len(shape) == 4:
        h, w = shape[2:]
        if h % patch or w % patch or min(h, w) < patch:
            fit = "x".join(str(max(s // patch, 1) * patch) for s in (h, w))
            return (f"images of {h}x{w} are not whole {patch}x{patch} patches: input '{name}' of model '{model}' has shape {shape}; "
                    f"this model takes any size in whole patches: crop or resize to e.g. {fit}")  # fmt: skip
        if sizes and not (sizes[0][0] <= h <= sizes[1][0] and sizes[0][1] <= w <= sizes[1][1]):
            (h0, w0), (h1, w1) = sizes
            return (f"images of {h}x{w} are outside the sizes model '{model}' was built for, {h0}x{w0} to {h1}x{w1} (its TensorRT "
                    f"profile): input '{name}' has shape {shape}; resize them into that range")  # fmt: skip
    if array.dtype.kind == "f" and not ALLOW_NONFINITE:
        bad = array.size - int(np.count_nonzero(np.isfinite(array)))
        if bad:
            return (f"non-finite values: input '{name}' of model '{model}' has {bad} NaN or infinite values out of {array.size}; "
                    f"send finite {expected}, already normalised")  # fmt: skip
    return None


def one_line(message):
    """The last `Type: text` line of a Python error text (tracebacks included), without the module path."""
    lines = [m for m in (_EXCEPTION_LINE.match(line.strip()) for line in str(message).splitlines()) if m]
    if not lines:
        text = " ".join(str(message).split())
        return text[:300] or "unknown error"
    kind, text = lines[-1].groups()
    return f"{kind.rsplit('.', 1)[-1]}: {text}"


try:  # inside Triton's python backend, next to PyTriton's proxy model
    import triton_python_backend_utils as pb_utils  # type: ignore

    from .pytriton_model import TritonPythonModel as _PyTritonModel  # type: ignore
except ImportError:  # imported by vitfast itself (tests, or to read this file's source)
    _PyTritonModel = None

if _PyTritonModel is not None:

    class TritonPythonModel(_PyTritonModel):
        """PyTriton's proxy model with a check of each request before it, and one-line errors after."""

        def initialize(self, args):
            super().initialize(args)
            config = json.loads(args["model_config"])
            self._vitfast_model = args["model_name"]
            self._vitfast_inputs = {i["name"]: [int(d) for d in i.get("dims", [])] for i in config["input"]}
            self._vitfast_decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)

        def execute(self, requests):
            if self._vitfast_decoupled:  # responses go through response senders there: not used by vitfast
                return super().execute(requests)
            problems = [self._problem(request) for request in requests]
            good = [request for request, problem in zip(requests, problems) if problem is None]
            served = []
            if good:
                try:
                    served = list(super().execute(good))
                except Exception as exc:  # PyTriton's wrapper of whatever failed: a traceback as the message
                    pb_utils.Logger.log_error(f"vitfast: model '{self._vitfast_model}' failed on a batch: {exc}")
                    message = (f"model '{self._vitfast_model}' failed on this request: {one_line(exc)} "
                               "(the server log has the details; vitfast serve --verbose shows it)")  # fmt: skip
                    served = [_error(message, "INTERNAL") for _ in good]
            served = iter(served)
            return [next(served) if problem is None else _error(problem, "INVALID_ARG") for problem in problems]

        def _problem(self, request):
            for name, dims in self._vitfast_inputs.items():
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    problem = find_problem(self._vitfast_model, name, tensor.as_numpy(), dims, PATCH_SIZE, SIZE_RANGE)
                    if problem:
                        return problem
            return None

    def _error(message, code):
        code = getattr(pb_utils.TritonError, code, None)
        error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
        return pb_utils.InferenceResponse(error=error)
