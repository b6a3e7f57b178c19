"""norcal.runtime: host pre/post-processing (resize rules, mask paste, results), the backends'
runners (ONNX Runtime, TensorRT: ``backends``) and engine builds, batched inference over
images, on a Ray cluster (``ray_inference``), Triton model repositories (``triton``), and the
C++ host (``cpp/``)."""
