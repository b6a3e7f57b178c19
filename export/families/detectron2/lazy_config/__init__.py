"""A detectron2 LazyConfig's config.yaml read as data (nothing imported or called) as the
yacs-era keys: R-CNN, Cascade, RegNet and ViTDet/MViT backbones."""
