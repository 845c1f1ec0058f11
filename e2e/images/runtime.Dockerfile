# The serving runtime image: `inferfleet-runtime serve|compile|fetch|demo-model|bench`, the program
# every serving pod and compile Job of the operator runs (the manifests call `inferfleet-runtime`).
# Built by e2e/kind/images.sh; by hand from the repository root:
#   python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
#     print("\\n".join(p["dependencies"] + p["optional-dependencies"]["runtime"]))' > /tmp/requirements-runtime.txt
#   tar -c pyproject.toml README.md runtime operator e2e/images -C /tmp requirements-runtime.txt -C /etc/ssl/certs \
#     --transform s/ca-certificates.crt/build-ca.crt/ ca-certificates.crt | \
#     docker build -f e2e/images/runtime.Dockerfile -t inferfleet/runtime-cpu:dev -
# Flavours (build args):
#   CPU (CPU_ONLY=1, as images.sh builds it): torch from PyPI. PyPI's Linux wheels carry the CUDA libraries,
#     some of which torch loads even on CPU (the rest leave the image); with a reachable
#     https://download.pytorch.org/whl/cpu pass it as TORCH_INDEX_URL for an image about 4 GB smaller.
#   CUDA: the default build (no CPU_ONLY) already is one (PyPI torch is the CUDA build); run it with the NVIDIA
#     container toolkit. Tag it inferfleet/runtime-cuda.
#   ROCm: TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm<version> (the ROCm build of torch
#     and its Triton); run with /dev/kfd and /dev/dri. Tag it inferfleet/runtime-rocm.
ARG BASE_IMAGE=debian:bookworm
FROM ${BASE_IMAGE} AS deps
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/inferfleet
ENV PATH=/opt/inferfleet/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The build host's CA bundle (images.sh adds it to the context; empty when it has none), for hosts
# whose package index is reached through a TLS-inspecting proxy. Only this build stage sees it.
COPY build-ca.crt /tmp/build-ca.crt
ARG TORCH_INDEX_URL=""
# Dependencies first, from the requirements images.sh reads out of pyproject.toml (the project's own and this
# image's extra): a source change, or an edit elsewhere in pyproject.toml, rebuilds only the layers above.
COPY requirements-runtime.txt /tmp/requirements.txt
RUN if [ -s /tmp/build-ca.crt ]; then export PIP_CERT=/tmp/build-ca.crt; fi \
 && if [ -n "$TORCH_INDEX_URL" ]; then pip install -q --index-url "$TORCH_INDEX_URL" torch; fi \
 && pip install -q -r /tmp/requirements.txt
# CPU_ONLY=1 (what images.sh builds): the GPU libraries that torch never opens on a CPU leave the image, about
# 1.2 GB of its 6.4 (cuDNN's engine libraries, which libcudnn opens on first use on a GPU, NVSHMEM's device code
# and transports, cuSOLVER's multi-GPU library, profiler libraries, headers and static archives). torch still
# imports and runs, which the last line checks; the libraries torch links against stay.
ARG CPU_ONLY=""
RUN if [ -n "$CPU_ONLY" ]; then \
      cd /opt/inferfleet/lib/python3*/site-packages/nvidia \
      && rm -rf cudnn/lib/libcudnn_*.so.9 nvshmem/lib/*.bc nvshmem/lib/*.a nvshmem/lib/nvshmem_bootstrap_* \
           nvshmem/lib/nvshmem_transport_* cu13/lib/libcusolverMg.so.* cu13/lib/libnvperf_* cu13/lib/*.a \
           cu13/lib/libnvblas.so.* */include \
      && python3 -c 'import torch, triton; x = torch.randn(8, 8); assert torch.allclose(x @ torch.eye(8), x)'; \
    fi

# The project itself as a wheel: in the final image it is a small layer of its own above the
# dependencies' layer, which stays the same (and is loaded into clusters once) across source changes.
FROM deps AS wheel
COPY pyproject.toml README.md /src/
COPY runtime /src/runtime
COPY operator /src/operator
RUN if [ -s /tmp/build-ca.crt ]; then export PIP_CERT=/tmp/build-ca.crt; fi \
 && pip wheel -q --no-deps -w /wheels /src

FROM ${BASE_IMAGE}
# g++ with OpenMP: AOTInductor compiles engines with it (compile Jobs run this image), and serving pods
# build the native CPU kernels with it at start (kernels/native.py).
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-dev g++ libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 inferfleet && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home inferfleet
COPY --from=deps /opt/inferfleet /opt/inferfleet
COPY --from=wheel /wheels /wheels
# The pods run with a read-only root filesystem: every cache goes under /tmp (an emptyDir there).
ENV PATH=/opt/inferfleet/bin:$PATH HOME=/tmp XDG_CACHE_HOME=/tmp/cache PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor
RUN pip install -q --no-cache-dir --no-deps --no-index /wheels/*.whl && rm -rf /wheels && inferfleet-runtime --help >/dev/null
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["inferfleet-runtime"]
CMD ["--help"]
