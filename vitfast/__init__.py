"""vitfast: fast, faithful Vision Transformer inference.

Reference ViT/DeiT/hybrid models in plain PyTorch that load timm and Hugging Face checkpoints
exactly, plus (as they land) Triton kernels, ONNX/TensorRT export, benchmarks and serving.
"""

from ._version import __version__

from .checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from .config import ViTConfig  # noqa: E402
from .errors import (  # noqa: E402
    ArtifactError, BackendUnavailable, CheckpointError, ConfigError, GuessedConfigWarning, InputError, VitfastError,
)
from .model import VisionTransformer  # noqa: E402
from .optimize import batch_buckets, optimize, restore  # noqa: E402
from .preprocessing import preprocess  # noqa: E402
from .registry import create_model, get_config, list_models  # noqa: E402
from .runtime import Engine, load_engine  # noqa: E402

__all__ = [
    "__version__",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "get_config",
    "list_models",
    "load_checkpoint",
    "save_checkpoint",
    "optimize",
    "restore",
    "batch_buckets",
    "preprocess",
    "load_engine",
    "Engine",
    "VitfastError",
    "ConfigError",
    "CheckpointError",
    "InputError",
    "ArtifactError",
    "BackendUnavailable",
    "GuessedConfigWarning",
]
