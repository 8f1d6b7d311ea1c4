"""Export pipeline: ONNX, INT8 calibration, TensorRT engines, Triton model repositories.

Installed as `vitfast.export`. Not written yet (issue #4); nothing here is imported by the
reference model.
"""
