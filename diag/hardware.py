"""Peak compute and link bandwidth of the accelerators a trace ran on.

Problem: MFU needs the device's dense peak FLOP/s for the training dtype, and busbw is
only meaningful next to the peak bandwidth of the link it crossed. Traces carry the
device only as a `deviceProperties` name ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB
HBM3", "AMD Instinct MI250X / MI250", ...). This module maps such names onto vendor
datasheet numbers by substring rules. An unknown device or dtype gives None, never a
guess: a wrong peak silently scales every MFU.

All FLOP/s are DENSE (NVIDIA datasheets print "with sparsity" figures that are 2x the
dense ones; we halve those). All link figures are UNIDIRECTIONAL per GPU (datasheets
print bidirectional totals; we halve those), because nccl-tests busbw is unidirectional
(nccl-tests doc/PERFORMANCE.md). Every number below cites its source; docs/metrics.md
repeats the tables.
"""
from __future__ import annotations

import re

T = 1e12
GB = 1e9

# --- dtype names -------------------------------------------------------------------------
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "f16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp32": "fp32", "f32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "tf32": "tf32",
    "fp8": "fp8", "f8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}


def normalize_dtype(dtype: str | None) -> str | None:
    """'bfloat16' / 'torch.float16' / 'float8_e4m3fn' ... -> 'bf16' / 'fp16' / 'fp8' /
    'fp32' / 'tf32'; None when not a dtype this module has peaks for."""
    if not isinstance(dtype, str):
        return None
    return _DTYPE_ALIASES.get(dtype.strip().lower())


# --- dense peak FLOP/s per device ----------------------------------------------------------
# fp32 = non-tensor (CUDA-core / vector) FP32; tf32 = tensor-core TF32; bf16/fp16/fp8 =
# tensor-core (matrix-core) rates. A dtype the device has no hardware for is absent
# (V100 has no bf16 / tf32 / fp8; A100 and MI250 no fp8; MI250 no tf32).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    # NVIDIA Tesla V100 datasheet (2020): SXM2 FP16 tensor 125 TF, FP32 15.7 TF;
    # PCIe 112 TF / 14 TF; V100S PCIe 130 TF / 16.4 TF.
    "V100-SXM2": {"fp16": 125 * T, "fp32": 15.7 * T},
    "V100-PCIE": {"fp16": 112 * T, "fp32": 14.0 * T},
    "V100S-PCIE": {"fp16": 130 * T, "fp32": 16.4 * T},
    # NVIDIA A100 Tensor Core GPU datasheet (2021), identical for SXM4 40/80 GB and PCIe
    # 40/80 GB: BF16/FP16 312 TF (624 with sparsity), TF32 156 TF (312 sparse), FP32 19.5 TF.
    "A100": {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T},
    # NVIDIA H100 Tensor Core GPU datasheet (2023), sparse figures halved:
    # SXM5: BF16/FP16 1979/2 = 989.5 TF, FP8 3958/2 = 1979 TF, TF32 989/2 = 494.5 TF, FP32 67 TF.
    # PCIe: BF16/FP16 1513/2 = 756.5 TF, FP8 3026/2 = 1513 TF, TF32 756/2 = 378 TF, FP32 51 TF.
    # NVL:  BF16/FP16 1671/2 = 835.5 TF, FP8 3341/2 = 1670.5 TF, TF32 835/2 = 417.5 TF, FP32 60 TF.
    "H100-SXM": {"bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T,
                 "tf32": 494.5 * T, "fp32": 67 * T},
    "H100-PCIE": {"bf16": 756.5 * T, "fp16": 756.5 * T, "fp8": 1513 * T,
                  "tf32": 378 * T, "fp32": 51 * T},
    "H100-NVL": {"bf16": 835.5 * T, "fp16": 835.5 * T, "fp8": 1670.5 * T,
                 "tf32": 417.5 * T, "fp32": 60 * T},
    # NVIDIA H200 Tensor Core GPU datasheet (2024): H200 SXM has the H100 SXM compute
    # (BF16 1979 sparse, FP8 3958 sparse, TF32 989 sparse, FP32 67 TF); H200 NVL
    # BF16 1671 sparse, FP8 3341 sparse, TF32 835 sparse, FP32 60 TF.
    "H200-SXM": {"bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T,
                 "tf32": 494.5 * T, "fp32": 67 * T},
    "H200-NVL": {"bf16": 835.5 * T, "fp16": 835.5 * T, "fp8": 1670.5 * T,
                 "tf32": 417.5 * T, "fp32": 60 * T},
    # NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx, 8-GPU board),
    # per GPU = board / 8, sparse halved: FP16/BF16 36 PF sparse -> 2.25 PF dense,
    # FP8 72 PF sparse -> 4.5 PF dense, TF32 18 PF sparse -> 1.125 PF dense,
    # FP32 600 TF -> 75 TF. (Assumption: the HGX B200 power/clock configuration; DGX B200
    # quotes the same per-GPU tensor figures.)
    "B200": {"bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T,
             "tf32": 1125 * T, "fp32": 75 * T},
    # AMD Instinct MI250X / MI250 datasheets: per OAM (2 GCDs) MI250X FP16/BF16 matrix
    # 383 TF, FP32 vector 47.9 TF; MI250 362.1 TF, 45.3 TF. PyTorch sees each GCD as
    # its own device, so the per-device peak is HALF the OAM figure (assumption: the
    # trace's device is one GCD, which is how ROCm enumerates them). No TF32, no FP8.
    "MI250X": {"bf16": 383 * T / 2, "fp16": 383 * T / 2, "fp32": 47.9 * T / 2},
    "MI250": {"bf16": 362.1 * T / 2, "fp16": 362.1 * T / 2, "fp32": 45.3 * T / 2},
    # AMD Instinct MI300X datasheet: FP16/BF16 1307.4 TF dense, FP8 2614.9 TF dense,
    # TF32 653.7 TF dense, FP32 vector 163.4 TF (one device in the default SPX mode).
    "MI300X": {"bf16": 1307.4 * T, "fp16": 1307.4 * T, "fp8": 2614.9 * T,
               "tf32": 653.7 * T, "fp32": 163.4 * T},
}


# Substrings (any case) that tell a part's form factor; the model names are whole tokens (below).
_PCIE = ("PCIE", "HBM2E")                    # H100 PCIe is the HBM2e part
_SXM = ("SXM", "HBM3", "DGXS", "PG509")
_TOKEN = re.compile(r"[A-Z0-9]+")


def _parts(name: str) -> tuple[set, str]:
    """(the name's whole tokens, runs of letters and digits, and the name) in upper case: a token
    not glued to other letters or digits, so 'A100' is in 'A100-SXM4' but not in 'A1000' or
    'A100X'. One pass over the name where a compiled pattern per token cost ~2 ms of imports."""
    up = name.upper()
    return set(_TOKEN.findall(up)), up


def _has(up: str, subs: tuple) -> bool:
    return any(x in up for x in subs)


def device_key(device_name: str | None) -> str | None:
    """deviceProperties name -> key of PEAK_FLOPS, or None when not recognised.

    Rules (case-insensitive, whole tokens):
      V100S + PCIE -> V100S-PCIE; V100 + PCIE -> V100-PCIE; V100 + SXM/DGXS -> V100-SXM2
      (SXM3 in DGX-2 has the SXM2 rates); other V100 variants (FHHL) -> None.
      A100 (any form factor, incl. the PG509-200 board) -> A100.
      H100 + NVL -> H100-NVL; H100 + PCIe/HBM2e -> H100-PCIE; H100 + SXM/HBM3 -> H100-SXM;
      a bare 'H100' -> None (ambiguous).
      H200 + NVL -> H200-NVL; other H200 -> H200-SXM (the only other H200).
      B200 -> B200.  'MI250X / MI250' (the name ROCm reports for both) and MI250X ->
      MI250X (assumption: the common HPC part, Frontier/LUMI; MI250 is 5.5% slower, so
      MFU may read up to 5.5% low on MI250); MI250 alone -> MI250.  MI300X -> MI300X.
    """
    if not isinstance(device_name, str):
        return None
    tok, up = _parts(device_name)
    if "V100S" in tok:
        return "V100S-PCIE" if _has(up, _PCIE) else None
    if "V100" in tok:
        if _has(up, _PCIE):
            return "V100-PCIE"
        return "V100-SXM2" if _has(up, _SXM) else None
    if "A100" in tok:
        return "A100"
    if "H100" in tok:
        if "NVL" in tok:
            return "H100-NVL"
        if _has(up, _PCIE):
            return "H100-PCIE"
        return "H100-SXM" if _has(up, _SXM) else None
    if "H200" in tok:
        return "H200-NVL" if "NVL" in tok else "H200-SXM"
    for key in ("B200", "MI250X", "MI250", "MI300X"):
        if key in tok:
            return key
    return None


def peak_flops(device_name: str | None, dtype: str | None) -> float | None:
    """Dense peak FLOP/s of one device (as PyTorch enumerates it) for `dtype`
    ('bf16', 'bfloat16', 'fp16', 'fp32', 'tf32', 'fp8', ...); None when the device or
    the dtype is unknown or the device has no hardware for that dtype."""
    key, dt = device_key(device_name), normalize_dtype(dtype)
    if key is None or dt is None:
        return None
    return PEAK_FLOPS[key].get(dt)


# --- device memory -------------------------------------------------------------------------
# Bytes of device memory by PEAK_FLOPS key where the name does not say it (datasheets above):
# H100 SXM and PCIe 80 GB, H100 NVL 94 GB, H200 141 GB, B200 180 GB (HGX B200: 1.44 TB / 8),
# MI250X / MI250 128 GB per OAM = 64 GB per GCD (the device PyTorch sees), MI300X 192 GB.
# Memory "GB" on these datasheets are 2^30 bytes (80 GB HBM3 = 85,520,809,984 bytes in
# deviceProperties.totalGlobalMem, 79.6 GiB usable).
MEMORY_GIB: dict[str, float] = {"H100-SXM": 80, "H100-PCIE": 80, "H100-NVL": 94, "H200-SXM": 141, "H200-NVL": 141,
                                "B200": 180, "MI250X": 64, "MI250": 64, "MI300X": 192}
_GB_IN_NAME = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


def device_memory(device_name: str | None) -> float | None:
    """Bytes of memory of one device from its name ("A100-SXM4-80GB", "H100 80GB HBM3") or the
    table; None when neither says (an A100 or V100 without a size in its name)."""
    if not isinstance(device_name, str):
        return None
    m = _GB_IN_NAME.search(device_name)
    if m and 1 <= int(m.group(1)) <= 4096:
        return int(m.group(1)) * float(1 << 30)
    gib = MEMORY_GIB.get(device_key(device_name) or "")
    return gib * float(1 << 30) if gib else None


# --- links ---------------------------------------------------------------------------------
# Unidirectional bytes/s per GPU, the figure busbw (nccl-tests) is compared with.
LINKS: dict[str, float] = {
    # NVLink: NVIDIA V100/A100/H100/B200 datasheets give bidirectional totals per GPU:
    # V100 300 GB/s (6 links x 25 GB/s/dir), A100 600 GB/s (12 x 25), H100/H200 900 GB/s
    # (18 x 25), B200 1.8 TB/s (18 x 50); halved to one direction.
    "NVLink2": 150 * GB,
    "NVLink3": 300 * GB,
    "NVLink4": 450 * GB,
    "NVLink5": 900 * GB,
    # PCIe x16, one direction, after line coding: gen3 8 GT/s x 16 x 128/130 / 8 = 15.75 GB/s;
    # gen4 16 GT/s -> 31.5 GB/s; gen5 32 GT/s -> 63 GB/s (PCI-SIG base specifications).
    "PCIe3": 15.75 * GB,
    "PCIe4": 31.5 * GB,
    "PCIe5": 63.0 * GB,
    # InfiniBand per port, one direction: HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s,
    # XDR 800 Gb/s = 100 GB/s (NVIDIA ConnectX-6/7/8 product briefs). Per GPU assumes one
    # NIC port per GPU (rail-optimised clusters); fewer NICs per GPU divide it.
    "IB-HDR": 25 * GB,
    "IB-NDR": 50 * GB,
    "IB-XDR": 100 * GB,
    # AMD Infinity Fabric (xGMI). MI250X: 50 GB/s per link per direction (100 GB/s peak
    # bidirectional per link, AMD CDNA2 white paper). Assumption: GCDs on different OAMs
    # are joined by one link on typical 4-OAM nodes (Frontier, LUMI), so a ring over all
    # 8 GCDs is bounded by one link: 50 GB/s.
    "xGMI-MI250X": 50 * GB,
    # MI300X: 7 links x 128 GB/s bidirectional = 896 GB/s per GPU (AMD MI300X datasheet),
    # fully connected 8-GPU mesh, so per-GPU one-direction aggregate = 448 GB/s.
    "xGMI-MI300X": 448 * GB,
}

# Device key -> intra-node link. PCIe-card parts (V100/A100/H100 PCIe, H100/H200 NVL)
# are assumed to talk over PCIe: NVLink bridges on those cards join pairs only, so an
# 8-GPU collective is bounded by PCIe.
_INTRA = {
    "V100-SXM2": "NVLink2", "V100-PCIE": "PCIe3", "V100S-PCIE": "PCIe3",
    "H100-SXM": "NVLink4", "H100-PCIE": "PCIe5", "H100-NVL": "PCIe5",
    "H200-SXM": "NVLink4", "H200-NVL": "PCIe5",
    "B200": "NVLink5", "MI250X": "xGMI-MI250X", "MI250": "xGMI-MI250X",
    "MI300X": "xGMI-MI300X",
}


def intra_node_link(device_name: str | None) -> tuple[str, float] | None:
    """(link name, unidirectional bytes/s per GPU) of the intra-node interconnect of the
    device; None when not known. A100 is NVLink3 for SXM4 / PG509 boards and PCIe4
    for PCIe cards (a bare 'A100' name: None)."""
    key = device_key(device_name)
    if key is None:
        return None
    if key == "A100":
        up = device_name.upper()
        if _has(up, _PCIE):
            name = "PCIe4"
        elif _has(up, _SXM):
            name = "NVLink3"
        else:
            return None
    else:
        name = _INTRA[key]
    return name, LINKS[name]
