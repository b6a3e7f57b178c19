"""detectron2's config defaults (``detectron2/config/defaults.py``) for the keys we read.

Only keys that change inference, or that must be checked because we do not support them,
are listed; a config file that leaves one out gets this value, as in detectron2.
"""

from __future__ import annotations

import copy

_DEFAULTS = {
    "VERSION": 2,
    "MODEL": {
        "LOAD_PROPOSALS": False,
        "MASK_ON": False,
        "KEYPOINT_ON": False,
        "META_ARCHITECTURE": "GeneralizedRCNN",
        "PIXEL_MEAN": [103.530, 116.280, 123.675],
        "PIXEL_STD": [1.0, 1.0, 1.0],
        "BACKBONE": {"NAME": "build_resnet_backbone"},
        "FPN": {"IN_FEATURES": [], "OUT_CHANNELS": 256, "NORM": "", "FUSE_TYPE": "sum"},
        "PROPOSAL_GENERATOR": {"NAME": "RPN", "MIN_SIZE": 0},
        "ANCHOR_GENERATOR": {
            "NAME": "DefaultAnchorGenerator",
            "SIZES": [[32, 64, 128, 256, 512]],
            "ASPECT_RATIOS": [[0.5, 1.0, 2.0]],
            "OFFSET": 0.0,
        },
        "RETINANET": {
            "NUM_CLASSES": 80, "IN_FEATURES": ["p3", "p4", "p5", "p6", "p7"], "NUM_CONVS": 4,
            "SCORE_THRESH_TEST": 0.05, "TOPK_CANDIDATES_TEST": 1000, "NMS_THRESH_TEST": 0.5,
            "BBOX_REG_WEIGHTS": [1.0, 1.0, 1.0, 1.0], "NORM": "",
        },
        "RPN": {
            "HEAD_NAME": "StandardRPNHead",
            "IN_FEATURES": ["res4"],
            "BBOX_REG_WEIGHTS": [1.0, 1.0, 1.0, 1.0],
            "PRE_NMS_TOPK_TEST": 6000,
            "POST_NMS_TOPK_TEST": 1000,
            "NMS_THRESH": 0.7,
            "CONV_DIMS": [-1],
        },
        "ROI_HEADS": {
            "NAME": "Res5ROIHeads",
            "NUM_CLASSES": 80,
            "IN_FEATURES": ["res4"],
            "SCORE_THRESH_TEST": 0.05,
            "NMS_THRESH_TEST": 0.5,
        },
        "ROI_BOX_HEAD": {
            "NAME": "",
            "BBOX_REG_WEIGHTS": [10.0, 10.0, 5.0, 5.0],
            "POOLER_RESOLUTION": 14,
            "POOLER_SAMPLING_RATIO": 0,
            "POOLER_TYPE": "ROIAlignV2",
            "NUM_FC": 0,
            "FC_DIM": 1024,
            "NUM_CONV": 0,
            "CONV_DIM": 256,
            "NORM": "",
            "CLS_AGNOSTIC_BBOX_REG": False,
            "USE_SIGMOID_CE": False,
        },
        "ROI_BOX_CASCADE_HEAD": {
            "BBOX_REG_WEIGHTS": [[10.0, 10.0, 5.0, 5.0], [20.0, 20.0, 10.0, 10.0], [30.0, 30.0, 15.0, 15.0]],
            "IOUS": [0.5, 0.6, 0.7],
        },
        "ROI_MASK_HEAD": {
            "NAME": "MaskRCNNConvUpsampleHead",
            "POOLER_RESOLUTION": 14,
            "POOLER_SAMPLING_RATIO": 0,
            "NUM_CONV": 0,
            "CONV_DIM": 256,
            "NORM": "",
            "CLS_AGNOSTIC_MASK": False,
            "POOLER_TYPE": "ROIAlignV2",
        },
        "RESNETS": {
            "DEPTH": 50,
            "OUT_FEATURES": ["res4"],
            "NUM_GROUPS": 1,
            "NORM": "FrozenBN",
            "WIDTH_PER_GROUP": 64,
            "STRIDE_IN_1X1": True,
            "RES5_DILATION": 1,
            "RES2_OUT_CHANNELS": 256,
            "STEM_OUT_CHANNELS": 64,
            "DEFORM_ON_PER_STAGE": [False, False, False, False],
        },
    },
    "INPUT": {"MIN_SIZE_TEST": 800, "MAX_SIZE_TEST": 1333, "FORMAT": "BGR"},
    "TEST": {"DETECTIONS_PER_IMAGE": 100, "AUG": {"ENABLED": False}},
}


# Every key detectron2's get_cfg() has in the sections whose keys change what we export (from
# its cfg.dump()). merge_from_file raises KeyError for any other key, so a misspelt one there
# (SCORE_THRESH for SCORE_THRESH_TEST) is refused, not silently left at its default.
# TEST.CALIBRATION: the NorCal authors' add_norcal_config. IGNORE_THRESHOLD (RPN, ROI_HEADS):
# a training-only key detectron2 still accepts, which its configs/Base-RCNN-C4.yaml sets.
KNOWN_KEYS = {
    "INPUT": frozenset({'CROP', 'FORMAT', 'MASK_FORMAT', 'MAX_SIZE_TEST', 'MAX_SIZE_TRAIN', 'MIN_SIZE_TEST',
        'MIN_SIZE_TRAIN', 'MIN_SIZE_TRAIN_SAMPLING', 'RANDOM_FLIP'}),
    "TEST": frozenset({'AUG', 'DETECTIONS_PER_IMAGE', 'EVAL_PERIOD', 'EXPECTED_RESULTS',
        'KEYPOINT_OKS_SIGMAS', 'PRECISE_BN', 'CALIBRATION'}),
    "MODEL.ROI_HEADS": frozenset({'BATCH_SIZE_PER_IMAGE', 'IGNORE_THRESHOLD', 'IN_FEATURES', 'IOU_LABELS',
        'IOU_THRESHOLDS', 'NAME', 'NMS_THRESH_TEST', 'NUM_CLASSES', 'POSITIVE_FRACTION', 'PROPOSAL_APPEND_GT',
        'SCORE_THRESH_TEST'}),
    "MODEL.RPN": frozenset({'BATCH_SIZE_PER_IMAGE', 'BBOX_REG_LOSS_TYPE', 'BBOX_REG_LOSS_WEIGHT',
        'BBOX_REG_WEIGHTS', 'BOUNDARY_THRESH', 'CONV_DIMS', 'HEAD_NAME', 'IGNORE_THRESHOLD', 'IN_FEATURES',
        'IOU_LABELS', 'IOU_THRESHOLDS', 'LOSS_WEIGHT', 'NMS_THRESH', 'POSITIVE_FRACTION', 'POST_NMS_TOPK_TEST',
        'POST_NMS_TOPK_TRAIN', 'PRE_NMS_TOPK_TEST', 'PRE_NMS_TOPK_TRAIN', 'SMOOTH_L1_BETA'}),
    "MODEL.ROI_BOX_HEAD": frozenset({'BBOX_REG_LOSS_TYPE', 'BBOX_REG_LOSS_WEIGHT', 'BBOX_REG_WEIGHTS',
        'CLS_AGNOSTIC_BBOX_REG', 'CONV_DIM', 'FC_DIM', 'FED_LOSS_FREQ_WEIGHT_POWER', 'FED_LOSS_NUM_CLASSES',
        'NAME', 'NORM', 'NUM_CONV', 'NUM_FC', 'POOLER_RESOLUTION', 'POOLER_SAMPLING_RATIO', 'POOLER_TYPE',
        'SMOOTH_L1_BETA', 'TRAIN_ON_PRED_BOXES', 'USE_FED_LOSS', 'USE_SIGMOID_CE'}),
    "MODEL.ROI_MASK_HEAD": frozenset({'CLS_AGNOSTIC_MASK', 'CONV_DIM', 'NAME', 'NORM', 'NUM_CONV',
        'POOLER_RESOLUTION', 'POOLER_SAMPLING_RATIO', 'POOLER_TYPE'}),
    "MODEL.ANCHOR_GENERATOR": frozenset({'ANGLES', 'ASPECT_RATIOS', 'NAME', 'OFFSET', 'SIZES'}),
    "MODEL.RETINANET": frozenset({'BBOX_REG_LOSS_TYPE', 'BBOX_REG_WEIGHTS', 'FOCAL_LOSS_ALPHA',
        'FOCAL_LOSS_GAMMA', 'IN_FEATURES', 'IOU_LABELS', 'IOU_THRESHOLDS', 'NMS_THRESH_TEST', 'NORM',
        'NUM_CLASSES', 'NUM_CONVS', 'PRIOR_PROB', 'SCORE_THRESH_TEST', 'SMOOTH_L1_LOSS_BETA',
        'TOPK_CANDIDATES_TEST'}),
    "MODEL.RESNETS": frozenset({'DEFORM_MODULATED', 'DEFORM_NUM_GROUPS', 'DEFORM_ON_PER_STAGE', 'DEPTH',
        'NORM', 'NUM_GROUPS', 'OUT_FEATURES', 'RES2_OUT_CHANNELS', 'RES5_DILATION', 'STEM_OUT_CHANNELS',
        'STRIDE_IN_1X1', 'WIDTH_PER_GROUP'}),
    "MODEL.FPN": frozenset({'FUSE_TYPE', 'IN_FEATURES', 'NORM', 'OUT_CHANNELS'}),
    "MODEL.ROI_BOX_CASCADE_HEAD": frozenset({'BBOX_REG_WEIGHTS', 'IOUS'}),
    "MODEL.PROPOSAL_GENERATOR": frozenset({'MIN_SIZE', 'NAME'}),
    "MODEL.BACKBONE": frozenset({'FREEZE_AT', 'NAME'}),
}


def d2_defaults() -> dict:
    """A fresh nested-dict copy of the defaults (callers may merge into it)."""
    return copy.deepcopy(_DEFAULTS)
