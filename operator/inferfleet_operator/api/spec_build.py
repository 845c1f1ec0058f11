"""The InferenceRuntime and EngineBuild specs: runtime images and where they serve, and one compiled engine."""

from __future__ import annotations

from pydantic import StrictInt

from inferfleet_operator.api.schema import Model, field, item, rule
from inferfleet_operator.api.spec_common import (
    ENGINES,
    KEY_PATTERN,
    QUANTIZATIONS,
    RESOURCE_NAME_PATTERN,
    SECRET_NAME_PATTERN,
    URI_PATTERN,
    VENDORS,
    BuildResources,
    EngineEnvelope,
    Toleration,
    bytes_field,
    tolerations_field,
    vendor_list,
)

_FIXED = "is immutable: an EngineBuild records one engine; a different engine is a different EngineBuild"


class InferenceRuntimeSpec(Model):
    """One runtime image and where it can serve."""

    RULES = (
        rule(
            "self.image.size() > 0 && !self.image.contains(' ')",
            "image must name a container image (not empty, no spaces)",
            fieldPath=".image",
        ),
        rule(
            "self.engine != 'Compiled' || (has(self.compileImage) && self.compileImage.size() > 0 && "
            "!self.compileImage.contains(' '))",
            "compileImage is required when engine is Compiled and must name a container image (not empty, no spaces)",
            fieldPath=".compileImage",
        ),
        rule(
            "self.engine != 'Paged' || !has(self.compileImage) || self.compileImage == ''",
            "compileImage is only used by engine Compiled: remove it or set engine Compiled",
            fieldPath=".compileImage",
        ),
    )

    engine: str = field(..., "Paged or Compiled.", enum=ENGINES)
    vendors: tuple[str, ...] = vendor_list("GPU vendors it serves on.", ..., min_items=1)
    architectures: tuple[str, ...] = field(
        (),
        "GPU architectures it serves on (empty: every architecture of the vendors), e.g. sm90, gfx942.",
        items=item("Architecture.", maxLength=32),
        max_items=64,
        list_type="set",
    )
    image: str = field(..., "Serving image (runs `inferfleet-runtime serve`); not empty.", max_length=512)
    compile_image: str = field("", "Compiled only: image that runs `inferfleet-runtime compile`.", max_length=512)
    gpu_resource: str = field(
        "",
        "Extended resource pods request (empty: the one the pool's nodes advertise).",
        pattern=RESOURCE_NAME_PATTERN,
        max_length=253,
    )
    priority: StrictInt = field(0, "Higher wins among runtimes that fit a pool.", bounds=(-1000, 1000))


class BuildPlacement(Model):
    """Where compile Jobs may run (mutable: nodes come and go)."""

    node_names: tuple[str, ...] = field(
        (),
        "Nodes of the target architecture.",
        items=item("Node name.", maxLength=253),
        max_items=5000,
        list_type="set",
    )
    tolerations: tuple[Toleration, ...] = tolerations_field(33)  # the service's 32 and the GPU resource's


def _fixed(name: str) -> list[dict]:
    return [rule("self == oldSelf", f"{name} {_FIXED}")]


class EngineBuildSpec(Model):
    """One compiled engine, named by its key. Written by the operator."""

    engine_key: str = field(
        ..., "Content hash of what determines the engine.", pattern=KEY_PATTERN, rules=_fixed("engineKey")
    )
    model_uri: str = field(
        ...,
        "Model weights URI.",
        max_length=1024,
        rules=_fixed("modelUri")
        + [
            rule(
                f"self.matches('{URI_PATTERN}')",
                "modelUri must be pvc://CLAIM/PATH, hf://ORG/NAME, file:///ABSOLUTE/PATH or s3://BUCKET/KEY",
            )
        ],
    )
    revision: str = field(..., "Model revision.", max_length=128, rules=_fixed("revision"))
    envelope: EngineEnvelope = field(
        ..., "The envelope the engine is compiled for.", crd_default={}, rules=_fixed("envelope")
    )
    vendor: str = field(..., "Target vendor.", enum=VENDORS, rules=_fixed("vendor"))
    architecture: str = field(..., "Target GPU architecture.", max_length=32, rules=_fixed("architecture"))
    image: str = field(..., "Serving image that loads the engine.", max_length=512, rules=_fixed("image"))
    compile_image: str = field(..., "Image that compiles it.", max_length=512, rules=_fixed("compileImage"))
    gpu_resource: str = field("", "Extended resource the compile Job requests.", max_length=253)
    gpus: StrictInt = field(1, "GPUs the compile Job requests.", bounds=(0, 16))
    max_attempts: StrictInt = field(3, "Compile Jobs tried before the build is Failed.", bounds=(1, 10))
    backoff_seconds: StrictInt = field(
        10, "Delay after the first failed attempt; doubles each attempt.", bounds=(1, 3600)
    )
    placement: BuildPlacement = field(factory=BuildPlacement)
    deadline_seconds: StrictInt = field(
        7200, "Seconds one attempt may take (the Job's activeDeadlineSeconds).", bounds=(60, 7 * 86400)
    )  # per attempt, download included
    resources: BuildResources = field(factory=BuildResources)
    model_size: str = bytes_field(
        "",
        "Bytes of the downloaded model (emptyDir sizeLimit, ephemeral-storage request); empty: unbounded.",
        "modelSize",
    )
    credentials_secret: str = field(
        "",
        "Secret whose keys become the model download's environment; empty: none.",
        pattern=SECRET_NAME_PATTERN,
        max_length=253,
    )
    quantization: str = field(
        "Auto",
        "The service's spec.model.quantization (part of the key).",
        enum=QUANTIZATIONS,
        rules=_fixed("quantization"),
    )
