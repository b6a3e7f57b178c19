"""FrozenBN folded into the convolution at export: the same function, and the model unchanged after."""

import torch

from norcal.export.rcnn.modeling.folding import frozen_bn_folded
from norcal.export.rcnn.modeling.layers import Conv2d


def test_folded_conv_equals_conv_then_frozen_bn_and_is_restored():
    gen = torch.Generator().manual_seed(0)
    conv = Conv2d(8, 16, 3, padding=1, bias=False, norm="FrozenBN", relu=True)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
        conv.norm.weight.copy_(torch.rand(16, generator=gen) + 0.5)
        conv.norm.bias.copy_(torch.randn(16, generator=gen))
        conv.norm.running_mean.copy_(torch.randn(16, generator=gen))
        conv.norm.running_var.copy_(torch.rand(16, generator=gen) + 0.1)
    x = torch.randn((2, 8, 12, 12), generator=gen)
    n = conv.norm
    # the reference: detectron2's FrozenBN as F.batch_norm after a plain convolution
    ref = torch.relu(torch.nn.functional.batch_norm(
        torch.nn.functional.conv2d(x, conv.weight, padding=1), n.running_mean, n.running_var,
        n.weight, n.bias, training=False, eps=n.eps))
    weight = conv.weight
    with torch.no_grad(), frozen_bn_folded(conv):
        assert conv.norm is None and conv.bias is not None
        folded = conv(x)
    torch.testing.assert_close(folded, ref, rtol=1e-5, atol=1e-4)
    assert conv.norm is n and conv.bias is None and conv.weight is weight
