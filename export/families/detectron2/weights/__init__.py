"""detectron2 checkpoints' state dicts read as the architecture they show: ResNet, RegNet,
ViT, MViT backbones, RetinaNet, and the backbones we refuse by name."""
