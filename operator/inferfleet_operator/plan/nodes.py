"""classify_node: a Node object -> its accelerator vendor, product, architecture and GPU count, from every common signal."""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferfleet_operator.api.names import NODE_CLASS_LABEL
from inferfleet_operator.api.quantity import to_int, to_millis

# Extended resources advertised by each vendor's device plugin, in the order they are tried.
GPU_RESOURCES = (
    ("nvidia", "nvidia.com/gpu"),
    ("amd", "amd.com/gpu"),
    ("intel", "gpu.intel.com/xe"),
    ("intel", "gpu.intel.com/i915"),
    ("habana", "habana.ai/gaudi"),
)
DEFAULT_RESOURCE = {
    "nvidia": "nvidia.com/gpu",
    "amd": "amd.com/gpu",
    "intel": "gpu.intel.com/i915",
    "habana": "habana.ai/gaudi",
}

# PCI vendor ids (NFD labels feature.node.kubernetes.io/pci-<class>_<vendor>[_<device>].present).
PCI_VENDORS = {"10de": "nvidia", "1002": "amd", "8086": "intel", "1da3": "habana"}
# PCI display-controller classes: VGA, XGA, 3D, other display. Intel's vendor id is on nearly every
# x86 board (NICs, chipsets), so for Intel only a class-qualified display-controller label counts.
DISPLAY_CLASSES = ("0300", "0301", "0302", "0380", "1200")  # 1200: processing accelerator (Gaudi)
_NFD_PCI = re.compile(
    r"^feature\.node\.kubernetes\.io/pci-(?:(?P<cls>[0-9a-f]{4})_)?(?P<vendor>[0-9a-f]{4})(?:_(?P<device>[0-9a-f]{4}))?\.present$"
)
_INTEL_DEVICE_LABEL = re.compile(r"^gpu\.intel\.com/device-id\.(?P<cls>[0-9a-f]{4})-(?P<device>[0-9a-f]{4})\.present$")

# PCI device id -> (product, architecture).
PCI_DEVICES = {
    "nvidia": {
        "2330": ("h100-80gb-hbm3", "sm90"),
        "2331": ("h100-pcie", "sm90"),
        "2335": ("h200", "sm90"),
        "20b0": ("a100-sxm4-40gb", "sm80"),
        "20b2": ("a100-sxm4-80gb", "sm80"),
        "20b5": ("a100-80gb-pcie", "sm80"),
        "26b9": ("l40s", "sm89"),
        "27b8": ("l4", "sm89"),
        "1eb8": ("tesla-t4", "sm75"),
        "2237": ("a10g", "sm86"),
        "2901": ("b200", "sm100"),
    },
    "amd": {
        "74a1": ("mi300x", "gfx942"),
        "74a5": ("mi325x", "gfx942"),
        "74a0": ("mi300a", "gfx942"),
        "740c": ("mi250x", "gfx90a"),
        "740f": ("mi210", "gfx90a"),
        "738c": ("mi100", "gfx908"),
        "66a1": ("mi50", "gfx906"),
        "75a0": ("mi350x", "gfx950"),
    },
    "intel": {
        "0bd5": ("max-1550", "xe-hpc"),
        "0bd6": ("max-1550", "xe-hpc"),
        "0bda": ("max-1100", "xe-hpc"),
        "56c0": ("flex-170", "xe-hpg"),
        "56c1": ("flex-140", "xe-hpg"),
        "56a0": ("arc-a770", "xe-hpg"),
    },
    "habana": {"1000": ("gaudi", "gaudi"), "1020": ("gaudi2", "gaudi2"), "1060": ("gaudi3", "gaudi3")},
}

# Product name fragment -> architecture, for products named by labels (first match wins: longer fragments first).
NVIDIA_PRODUCT_ARCH = (
    ("gh200", "sm90"),
    ("h200", "sm90"),
    ("h100", "sm90"),
    ("h800", "sm90"),
    ("gb200", "sm100"),
    ("b200", "sm100"),
    ("b100", "sm100"),
    ("a100", "sm80"),
    ("a800", "sm80"),
    ("a30", "sm80"),
    ("a10g", "sm86"),
    ("a10", "sm86"),
    ("a40", "sm86"),
    ("a6000", "sm86"),
    ("l40", "sm89"),
    ("l4", "sm89"),
    ("rtx-4090", "sm89"),
    ("t4", "sm75"),
    ("v100", "sm70"),
)
NVIDIA_FAMILY_ARCH = {
    "volta": "sm70",
    "turing": "sm75",
    "ampere": "sm80",
    "ada-lovelace": "sm89",
    "hopper": "sm90",
    "blackwell": "sm100",
}
AMD_PRODUCT_ARCH = (
    ("mi355", "gfx950"),
    ("mi350", "gfx950"),
    ("mi325", "gfx942"),
    ("mi300", "gfx942"),
    ("mi250", "gfx90a"),
    ("mi210", "gfx90a"),
    ("mi100", "gfx908"),
    ("mi60", "gfx906"),
    ("mi50", "gfx906"),
)
INTEL_PRODUCT_ARCH = (("max", "xe-hpc"), ("flex", "xe-hpg"), ("arc", "xe-hpg"))

UNKNOWN = "unknown"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    vendor: str  # nvidia | amd | intel | habana | cpu
    product: str  # DNS-safe slug, e.g. "h100-80gb-hbm3", "mi300x", "amd64" for cpu nodes
    architecture: str  # e.g. "sm90", "gfx942", "xe-hpc", "amd64"; "unknown" when no signal names it
    gpu_count: int  # allocatable accelerators (0 for cpu)
    gpu_resource: str  # the extended resource pods request ("" for cpu)
    is_eligible: bool
    excluded_reason: str  # "" when eligible
    pool_label: tuple[str, str] | None  # a label naming the product on this node (used for affinity)
    cpu_millis: int  # allocatable CPU
    labels: dict
    taints: tuple[dict, ...]
    signals: tuple[str, ...]  # which signal schemes contributed, for explanations
    node_class: str = ""  # the NODE_CLASS_LABEL value: its own pool within the vendor and product ("" for none)


NODE_CLASS_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$")  # a pool name's part: short and DNS-safe


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _count(value) -> int:
    """An integer label value (a GPU count, a compute capability digit); 0 when it is not one."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _match_arch(product: str, table) -> str:
    for fragment, arch in table:
        if fragment in product:
            return arch
    return UNKNOWN


def _from_resources(allocatable: dict):
    for vendor, resource in GPU_RESOURCES:
        count = to_int(allocatable.get(resource, 0))
        if count > 0:
            return vendor, resource, count
    return None


def _nvidia_labels(labels: dict):
    product = labels.get("nvidia.com/gpu.product", "")
    major, minor = labels.get("nvidia.com/gpu.compute.major"), labels.get("nvidia.com/gpu.compute.minor")
    family = labels.get("nvidia.com/gpu.family", "").lower()
    present = (
        product
        or major
        or family
        or labels.get("nvidia.com/gpu.count")
        or labels.get("nvidia.com/gpu.present") == "true"
    )
    if not present:
        return None
    slug = _slug(product)
    slug = slug[len("nvidia-") :] if slug.startswith("nvidia-") else slug
    if major is not None and minor is not None:
        arch = f"sm{_count(major)}{_count(minor)}"
    else:
        arch = _match_arch(slug, NVIDIA_PRODUCT_ARCH) if slug else UNKNOWN
        if arch == UNKNOWN and family:
            arch = NVIDIA_FAMILY_ARCH.get(family, UNKNOWN)
    pool_label = ("nvidia.com/gpu.product", product) if product else None
    return "nvidia", slug or UNKNOWN, arch, _count(labels.get("nvidia.com/gpu.count", 0)), pool_label


AMD_LABEL_FIELDS = ("product-name", "device-id", "family", "count")
AMD_BETA_PREFIX = "beta.amd.com/gpu."


def amd_gpu_labels(labels: dict) -> dict:
    """The AMD labeller's labels as `amd.com/gpu.<field>` -> value. Its older `beta.amd.com` scheme spells a
    field either the same way (`beta.amd.com/gpu.family=AI`) or with the value in the key and a count as
    the label's value (`beta.amd.com/gpu.device-id.74a1=8`); the `amd.com` label wins when both exist."""
    out = {}
    for key, value in labels.items():
        if not key.startswith(AMD_BETA_PREFIX):
            continue
        rest = key[len(AMD_BETA_PREFIX) :]
        for name in AMD_LABEL_FIELDS:
            if rest == name:
                out[f"amd.com/gpu.{name}"] = str(value)
            elif rest.startswith(name + ".") and name != "count":
                out[f"amd.com/gpu.{name}"] = rest[len(name) + 1 :]
    out.update({k: v for k, v in labels.items() if k.startswith("amd.com/gpu.")})
    return out


def _amd_labels(node_labels: dict):
    labels = amd_gpu_labels(node_labels)
    product_name = labels.get("amd.com/gpu.product-name", "")
    device_id = labels.get("amd.com/gpu.device-id", "").lower().removeprefix("0x")
    family = labels.get("amd.com/gpu.family", "").lower()
    if not (product_name or device_id or family or labels.get("amd.com/gpu.count")):
        return None
    product, arch = PCI_DEVICES["amd"].get(device_id, ("", UNKNOWN))
    if product_name:
        match = re.search(r"mi\d+[a-z]*", product_name.lower())
        product = match.group(0) if match else _slug(product_name)
        arch = _match_arch(product, AMD_PRODUCT_ARCH) if arch == UNKNOWN else arch
    if arch == UNKNOWN and family.startswith("gfx"):
        arch = family
    # Affinity needs a label that node really carries with this value (not one rebuilt from a beta key).
    if product_name and node_labels.get("amd.com/gpu.product-name") == product_name:
        pool_label = ("amd.com/gpu.product-name", product_name)
    elif device_id and "amd.com/gpu.device-id" in node_labels:
        pool_label = ("amd.com/gpu.device-id", node_labels["amd.com/gpu.device-id"])
    else:
        pool_label = None
    return "amd", product or UNKNOWN, arch, _count(labels.get("amd.com/gpu.count", 0)), pool_label


def _intel_labels(labels: dict):
    device_ids = sorted(m.group("device") for key in labels if (m := _INTEL_DEVICE_LABEL.match(key)))
    product_label = labels.get("gpu.intel.com/product", "")
    family = labels.get("gpu.intel.com/family", "")
    if not (device_ids or product_label or family):
        return None
    product, arch = ("", UNKNOWN)
    for device in device_ids:
        if device in PCI_DEVICES["intel"]:
            product, arch = PCI_DEVICES["intel"][device]
            break
    if product_label:
        product = _slug(product_label)
        arch = _match_arch(product, INTEL_PRODUCT_ARCH) if arch == UNKNOWN else arch
    if arch == UNKNOWN and family:
        arch = _match_arch(_slug(family), INTEL_PRODUCT_ARCH)
    pool_label = ("gpu.intel.com/product", product_label) if product_label else None
    return "intel", product or UNKNOWN, arch, 0, pool_label


def _nfd_pci(labels: dict):
    """NFD PCI labels -> (vendor, product, arch) of the first accelerator found, or None."""
    found = []
    for key, value in labels.items():
        match = _NFD_PCI.match(key)
        if not match or str(value).lower() != "true":
            continue
        vendor = PCI_VENDORS.get(match.group("vendor"))
        cls = match.group("cls")
        if vendor is None or (cls is not None and cls not in DISPLAY_CLASSES):
            continue
        if vendor == "intel" and cls is None:
            continue  # vendor-only Intel label: every Intel chipset carries it
        device = match.group("device")
        product, arch = PCI_DEVICES[vendor].get(device, (UNKNOWN, UNKNOWN)) if device else (UNKNOWN, UNKNOWN)
        found.append((product == UNKNOWN, vendor, product, arch))
    if not found:
        return None
    _, vendor, product, arch = min(found)  # prefer a label that names the device
    return vendor, product, arch


def _ready_reason(node: dict) -> str:
    if (node.get("spec") or {}).get("unschedulable"):
        return "Unschedulable: the node is cordoned (spec.unschedulable)"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return "NotReady: the node reports no Ready condition"
    if ready.get("status") != "True":
        return f"NotReady: Ready is {ready.get('status')} ({ready.get('reason', 'no reason')})"
    return ""


def classify_node(node: dict) -> NodeInfo:
    """Vendor from allocatable extended resources first, then vendor labels (GFD, AMD, Intel), then NFD PCI labels;
    product and architecture from the most specific signal present; cpu when no signal names an accelerator."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    labels = dict(meta.get("labels") or {})
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    signals: list[str] = []

    resource = _from_resources(allocatable)
    label_info = _nvidia_labels(labels) or _amd_labels(labels) or _intel_labels(labels)
    pci = _nfd_pci(labels)
    if resource:
        signals.append("extended-resource")
    if label_info:
        signals.append("vendor-labels")
    if pci:
        signals.append("nfd-pci")

    vendor = resource[0] if resource else label_info[0] if label_info else pci[0] if pci else "cpu"
    product, arch, label_count, pool_label = UNKNOWN, UNKNOWN, 0, None
    if label_info and label_info[0] == vendor:
        _, product, arch, label_count, pool_label = label_info
    if pci and pci[0] == vendor:
        product = pci[1] if product == UNKNOWN else product
        arch = pci[2] if arch == UNKNOWN else arch
        if product == pci[1] and arch == UNKNOWN:
            arch = pci[2]
    if vendor == "habana" and product == UNKNOWN:
        product = _slug(labels.get("habana.ai/gaudi.product", "")) or UNKNOWN
        arch = product if arch == UNKNOWN and product != UNKNOWN else arch

    reason = _ready_reason(node)
    node_class = labels.get(NODE_CLASS_LABEL, "")
    if node_class and not NODE_CLASS_PATTERN.match(node_class):
        reason = reason or (
            f"InvalidNodeClass: label {NODE_CLASS_LABEL}={node_class!r} must be lowercase letters, digits and '-', "
            "at most 20 characters"
        )
        node_class = ""
    if vendor == "cpu":
        cpu_arch = labels.get("kubernetes.io/arch", "amd64")
        product, arch, count, gpu_resource = _slug(cpu_arch), _slug(cpu_arch), 0, ""
    else:
        count = resource[2] if resource else 0
        gpu_resource = resource[1] if resource else DEFAULT_RESOURCE[vendor]
        if not resource and not reason:
            seen = label_count and f"{label_count} " or ""
            reason = (
                f"NoAllocatableGPUs: labels show {seen}{vendor} accelerator(s) but allocatable has no {gpu_resource} "
                "(is the device plugin running?)"
            )
    return NodeInfo(
        name=meta.get("name", ""),
        vendor=vendor,
        product=product,
        architecture=arch,
        gpu_count=count,
        gpu_resource=gpu_resource,
        is_eligible=not reason,
        excluded_reason=reason,
        pool_label=pool_label,
        cpu_millis=to_millis(allocatable.get("cpu", 0)),
        labels=labels,
        taints=tuple((node.get("spec") or {}).get("taints") or ()),
        signals=tuple(signals),
        node_class=node_class,
    )
