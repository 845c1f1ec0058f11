"""engine_key: the content address of a compiled engine, a hash over the canonical form of what determines it."""

from __future__ import annotations

import hashlib
import json

from inferfleet_operator.api.types import EngineBuildSpec, EngineEnvelope, PlanSettings, from_dict, to_dict

KEY_LENGTH = 16  # hex characters (64 bits): an EngineBuild's name


def canonical_envelope(envelope: dict | EngineEnvelope) -> dict:
    """The envelope with every default filled in and keys in camelCase, so `{}` and the spelled-out
    defaults give the same key."""
    if isinstance(envelope, EngineEnvelope):
        return to_dict(envelope)
    return to_dict(from_dict(EngineEnvelope, envelope, "engine"))


def canonical_form(
    model_uri: str,
    revision: str,
    envelope: dict | EngineEnvelope,
    architecture: str,
    runtime_image: str,
    quantization: str = "Auto",
    namespace: str = "",
) -> str:
    """quantization (spec.model.quantization) enters only when the runtime quantizes (Int8, Int4): Auto and None
    serve the checkpoint's own weights, and the keys of engines built before the field existed stay valid.
    namespace: the namespace whose engine this is, so that tenants never share an engine directory; "" when an
    administrator shares engines across namespaces (the key engines had before the namespace entered it)."""
    model = {"revision": revision or "main", "uri": model_uri}
    if quantization in ("Int8", "Int4"):
        model["quantization"] = quantization
    document = {
        "architecture": architecture,
        "envelope": canonical_envelope(envelope),
        "model": model,
        "runtimeImage": runtime_image,
    }
    if namespace:
        document["namespace"] = namespace
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def engine_key(
    model_uri: str,
    revision: str,
    envelope: dict | EngineEnvelope,
    architecture: str,
    runtime_image: str,
    quantization: str = "Auto",
    namespace: str = "",
) -> str:
    """sha256 of the canonical JSON, first KEY_LENGTH hex digits."""
    text = canonical_form(model_uri, revision, envelope, architecture, runtime_image, quantization, namespace)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def runtime_identity(compile_image: str, image: str) -> str:
    """What the engine depends on besides model and envelope: the compiler and the server that loads it."""
    return f"compile={compile_image};serve={image}"


def key_namespace(namespace: str, settings: PlanSettings) -> str:
    """The namespace that enters the keys of `namespace`'s engines: itself, or "" when the administrator shares
    engines across namespaces (--share-engines-across-namespaces)."""
    return "" if settings.share_engines_across_namespaces else namespace


def spec_key(spec: EngineBuildSpec, namespace: str) -> str:
    """The key an EngineBuild's spec hashes to in `namespace` (key_namespace); a build whose spec.engineKey differs
    is refused (KeyMismatch): its name would promise one engine and its Job would build another."""
    return engine_key(
        spec.model_uri,
        spec.revision,
        spec.envelope,
        spec.architecture,
        runtime_identity(spec.compile_image, spec.image),
        spec.quantization,
        namespace,
    )
