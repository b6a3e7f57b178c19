"""A detectron2 yacs config.yaml: the file and its _BASE_ chain over detectron2's defaults, typed
values, and the ModelSpec it describes."""
