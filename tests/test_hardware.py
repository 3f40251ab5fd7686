"""Device-name matching and peak tables (diag.hardware)."""
import pytest

from diag.hardware import (LINKS, PEAK_FLOPS, device_key, intra_node_link, normalize_dtype,
                           peak_flops)

T, GB = 1e12, 1e9


# Names as they appear in real traces' `deviceProperties`.
@pytest.mark.parametrize("name,key", [
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA A100-PG509-200", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ("Tesla V100-PCIE-16GB", "V100-PCIE"),
    ("Tesla V100S-PCIE-32GB", "V100S-PCIE"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIE"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA H200 NVL", "H200-NVL"),
    ("NVIDIA B200", "B200"),
    ("AMD Instinct MI250X / MI250", "MI250X"),
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI250", "MI250"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_device_key(name, key):
    assert device_key(name) == key
    assert device_key(name.lower()) == key


@pytest.mark.parametrize("name", [
    None, "", "cpu", "NVIDIA A10", "NVIDIA A1000", "NVIDIA A100X", "NVIDIA A800-SXM4-80GB",
    "NVIDIA GeForce RTX 4090", "NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA H100",
    "Tesla V100-FHHL-16GB", "AMD Instinct MI210", "AMD Instinct MI325X", "NVIDIA L40S",
])
def test_unknown_devices_give_none(name):
    assert device_key(name) is None
    assert peak_flops(name, "bf16") is None
    assert intra_node_link(name) is None


@pytest.mark.parametrize("name,dtype,flops", [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312 * T),
    ("NVIDIA A100-PG509-200", "bfloat16", 312 * T),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156 * T),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5 * T),
    ("NVIDIA A100 80GB PCIe", "fp16", 312 * T),
    ("Tesla V100-SXM2-16GB", "fp16", 125 * T),
    ("Tesla V100-SXM2-16GB", "float32", 15.7 * T),
    ("Tesla V100-PCIE-16GB", "half", 112 * T),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5 * T),
    ("NVIDIA H100 80GB HBM3", "float8_e4m3fn", 1979 * T),
    ("NVIDIA H100 80GB HBM3", "torch.bfloat16", 989.5 * T),
    ("NVIDIA H100 PCIe", "bf16", 756.5 * T),
    ("NVIDIA H200", "bf16", 989.5 * T),
    ("NVIDIA B200", "bf16", 2250 * T),
    ("NVIDIA B200", "fp8", 4500 * T),
    ("AMD Instinct MI250X / MI250", "bf16", 191.5 * T),   # 383 TF per OAM / 2 GCDs
    ("AMD Instinct MI300X", "bf16", 1307.4 * T),
    ("AMD Instinct MI300X", "fp8", 2614.9 * T),
])
def test_peak_flops(name, dtype, flops):
    assert peak_flops(name, dtype) == pytest.approx(flops, rel=1e-12)


@pytest.mark.parametrize("name,dtype", [
    ("Tesla V100-SXM2-16GB", "bf16"),       # no bf16 on Volta
    ("Tesla V100-SXM2-16GB", "tf32"),
    ("NVIDIA A100-SXM4-80GB", "fp8"),       # no fp8 on Ampere
    ("AMD Instinct MI250X / MI250", "tf32"),
    ("NVIDIA A100-SXM4-80GB", "int4"),
    ("NVIDIA A100-SXM4-80GB", None),
])
def test_missing_dtype_gives_none(name, dtype):
    assert peak_flops(name, dtype) is None


def test_normalize_dtype():
    assert normalize_dtype("BFloat16") == "bf16"
    assert normalize_dtype("float") == "fp32"
    assert normalize_dtype("float8_e5m2") == "fp8"
    assert normalize_dtype("int8") is None


@pytest.mark.parametrize("name,link,bw", [
    ("Tesla V100-SXM2-16GB", "NVLink2", 150 * GB),
    ("Tesla V100-PCIE-16GB", "PCIe3", 15.75 * GB),
    ("NVIDIA A100-SXM4-80GB", "NVLink3", 300 * GB),
    ("NVIDIA A100-PG509-200", "NVLink3", 300 * GB),
    ("NVIDIA A100 80GB PCIe", "PCIe4", 31.5 * GB),
    ("NVIDIA H100 80GB HBM3", "NVLink4", 450 * GB),
    ("NVIDIA H100 PCIe", "PCIe5", 63 * GB),
    ("NVIDIA H200", "NVLink4", 450 * GB),
    ("NVIDIA B200", "NVLink5", 900 * GB),
    ("AMD Instinct MI250X / MI250", "xGMI-MI250X", 50 * GB),
    ("AMD Instinct MI300X", "xGMI-MI300X", 448 * GB),
])
def test_intra_node_link(name, link, bw):
    assert intra_node_link(name) == (link, pytest.approx(bw))


def test_links_table():
    assert LINKS["IB-HDR"] == 25 * GB
    assert LINKS["IB-NDR"] == 50 * GB
    assert LINKS["IB-XDR"] == 100 * GB
    assert LINKS["NVLink4"] == 450 * GB
    assert all(v > 0 for v in LINKS.values())
    assert all(all(v > 0 for v in d.values()) for d in PEAK_FLOPS.values())
