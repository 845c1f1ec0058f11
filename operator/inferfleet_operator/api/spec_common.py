"""What more than one kind declares: value sets, patterns, the engine envelope, tolerations and build resources."""

from __future__ import annotations

from pydantic import StrictInt

from inferfleet_operator.api.schema import Model, field, item, rule

VENDORS = ("nvidia", "amd", "intel", "habana", "cpu")
POLICIES = ("Auto", "Paged", "Compiled")
FALLBACKS = ("Paged", "None")
ENGINES = ("Paged", "Compiled")
DTYPES = ("float16", "bfloat16", "float32")
# Auto: as the checkpoint says (float, or its own quantization_config); Int8/Int4: quantized by the runtime at load.
QUANTIZATIONS = ("Auto", "None", "Int8", "Int4")
BLOCK_SIZES = (8, 16, 32, 64)
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
BUILD_STATES = ("Pending", "Building", "Ready", "Failed")
INFERENCE_POOL_MODES = ("Auto", "Enabled", "Disabled")
ROUTING_MODES = ("Router", "Service")
FAILURE_MODES = ("FailOpen", "FailClose")
# Who may connect to a service's pods (spec.networkPolicy.exposure).
EXPOSURES = ("Namespace", "Listed", "Cluster")

URI_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/.+|hf://[^/]+/[^/]+|file:///.+|s3://[^/]+/.+)$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
# Patterns used inside CEL strings spell a literal dot as [.] (CEL has no \. escape).
# Bytes: a whole number, or a decimal with a unit; no `m` (512m is 0.512 bytes).
BYTES_PATTERN = r"^([0-9]+|[0-9]+([.][0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))$"
# A label key (what a taint key is): optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
SECRET_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$"
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"
KEY_PATTERN = r"^[0-9a-f]{16}$"  # an engine key, a model digest


def bytes_field(default: str, description: str, name: str):
    """A quantity of bytes: refuses the milli suffix with a message naming the field."""
    message = f"{name} must be whole bytes, e.g. 8Gi, 500M or 1073741824 (the m suffix means thousandths: 512m is 0.512 bytes)"
    return field(
        default, description, max_length=32, rules=[rule(f"self == '' || self.matches('{BYTES_PATTERN}')", message)]
    )


def vendor_list(description: str, default=(), min_items: int | None = None):
    return field(
        default,
        description,
        items=item("Vendor.", enum=VENDORS),
        max_items=len(VENDORS),
        list_type="set",
        min_items=min_items,
    )


class EngineEnvelope(Model):
    """The envelope a compiled engine is built for; paged serving uses the same limits."""

    max_context_length: StrictInt = field(
        4096, "Longest sequence (prompt + completion) in tokens.", bounds=(128, 1_048_576)
    )
    max_batch_size: StrictInt = field(16, "Most sequences decoded together.", bounds=(1, 4096))
    dtype: str = field("bfloat16", "Weight and activation dtype.", enum=DTYPES)
    tensor_parallel_size: StrictInt = field(
        1,
        "Ranks one replica shards the model over (tensor parallelism): its GPUs, or processes on a CPU pool. Over 1, "
        "compiled pools are served paged.",
        enum=TENSOR_PARALLEL_SIZES,
    )
    block_size: StrictInt = field(16, "Tokens per KV-cache block.", enum=BLOCK_SIZES)


class Toleration(Model):
    """A toleration copied to the pods (same meaning as a pod's)."""

    RULES = (
        rule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "tolerations[].value must be empty when operator is Exists",
        ),
        rule(
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "tolerations[].operator must be Exists when key is empty",
        ),
        rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerations[].tolerationSeconds needs effect NoExecute",
        ),
    )

    key: str = field(
        "",
        "Taint key (a label key such as nvidia.com/gpu); empty with operator Exists tolerates every taint.",
        max_length=253,
        rules=[
            rule(
                f"self == '' || self.matches('{LABEL_KEY_PATTERN}')",
                "tolerations[].key must be a label key such as nvidia.com/gpu: an optional DNS prefix and '/', then "
                "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            )
        ],
    )
    operator: str = field("Equal", "Exists or Equal.", enum=("Exists", "Equal"))
    value: str = field(
        "",
        "Taint value (Equal only).",
        max_length=63,
        rules=[
            rule(
                f"self.matches('{LABEL_VALUE_PATTERN}')",
                "tolerations[].value must be a label value: letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit",
            )
        ],
    )
    effect: str = field("", "Empty: every effect.", enum=("", "NoSchedule", "PreferNoSchedule", "NoExecute"))
    toleration_seconds: StrictInt | None = field(
        None, "NoExecute only: how long the pod stays after the taint appears.", bounds=(0, 86400 * 365)
    )


def tolerations_field(max_items: int = 32):
    return field((), "Tolerations for the nodes' taints.", max_items=max_items)


class BuildResources(Model):
    """Requests of the compile container."""

    cpu: str = field("2", "CPU request, a Kubernetes quantity.", pattern=QUANTITY_PATTERN)
    memory: str = bytes_field(
        "16Gi", "Memory request and limit, a Kubernetes quantity of bytes.", "build.resources.memory"
    )  # memory is request and limit
