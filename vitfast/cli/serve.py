"""`vitfast serve ARTIFACT`: flags in, `vitfast.serve.serve` runs the server."""

from __future__ import annotations

import argparse

from vitfast.flags import int_in, port, positive_int
from vitfast.scores import SCORES
from vitfast.serve import DEFAULT_PORTS, DEFAULT_QUEUE_DELAY_US, DEFAULT_TOP_K, require_pytriton, serve

from .config_args import read_labels
from .export import add_artifact_args, add_torch_args, load_artifact


def cmd_serve(args: argparse.Namespace) -> int:
    require_pytriton()  # before loading the artifact: a missing dependency is the first thing to say
    labels = read_labels(args.labels) if args.labels else None
    engine = load_artifact(args.artifact, args, labels=False, backend=args.backend)  # the uint8 model needs the preprocessing: refused here if unknown
    serve(engine, host=args.host, port=args.port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
          max_batch_size=args.max_batch, max_queue_delay_us=args.max_queue_delay_us, top_k=args.top_k, labels=labels, scores=args.scores,
          name=args.name, verbose=args.verbose, allow_nonfinite=args.allow_nonfinite)  # fmt: skip
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve an artifact on Triton Inference Server (dynamic batching, HTTP/gRPC, metrics)")
    p.add_argument("artifact", help="checkpoint, .onnx file (vitfast's or another tool's), Optimum folder or TensorRT engine")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=port, default=DEFAULT_PORTS["http"], help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=port, default=DEFAULT_PORTS["grpc"], help="gRPC port (default 8001)")
    p.add_argument("--metrics-port", type=port, default=DEFAULT_PORTS["metrics"], help="Prometheus metrics port (default 8002)")
    p.add_argument("--max-batch", type=positive_int, help="largest batch the dynamic batcher forms (default: the artifact's profile maximum, else 32)")
    p.add_argument("--max-queue-delay-us", type=int_in(0), default=DEFAULT_QUEUE_DELAY_US,
                   help=f"how long a request may wait for others to batch with (default {DEFAULT_QUEUE_DELAY_US} us)")  # fmt: skip
    p.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, help=f"classes in topk_indices / topk_scores (default {DEFAULT_TOP_K})")
    p.add_argument("--scores", choices=SCORES,
                   help="what topk_scores holds; default: as transformers' pipeline scores the model: sigmoid per class for "
                        "problem_type multi_label_classification or one class, the logits for regression, else softmax")  # fmt: skip
    p.add_argument("--name", default="vit", help="model name (default vit; the uint8 model is NAME_uint8)")
    p.add_argument("--labels", metavar="FILE", help="class names for topk_labels: one per line, or a JSON list / {index: name}")
    p.add_argument("--verbose", action="store_true", help="show the Triton server's own log")
    p.add_argument("--allow-nonfinite", action="store_true", help="run NaN / infinite float inputs instead of refusing them (as engine.allow_nonfinite)")
    add_artifact_args(p, labels=False)  # serve has its own --labels
    add_torch_args(p)
    p.set_defaults(func=cmd_serve)
