# The operator image: `inferfleet-operator` (kopf) alone, no torch. Runs as a non-root user with a
# read-only root filesystem; the final image has no shell (nothing at run time needs one).
# Built by e2e/kind/images.sh; by hand from the repository root:
#   python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
#     print("\\n".join(p["dependencies"] + p["optional-dependencies"]["operator"]))' > /tmp/requirements-operator.txt
#   tar -c pyproject.toml README.md runtime operator e2e/images -C /tmp requirements-operator.txt -C /etc/ssl/certs \
#     --transform s/ca-certificates.crt/build-ca.crt/ ca-certificates.crt | \
#     docker build -f e2e/images/operator.Dockerfile -t inferfleet/operator:dev -
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
COPY requirements-operator.txt /tmp/requirements.txt
RUN if [ -s /tmp/build-ca.crt ]; then export PIP_CERT=/tmp/build-ca.crt; fi \
 && pip install -q -r /tmp/requirements.txt

# The project itself as a wheel: in the final image it is a small layer of its own above the
# dependencies' layer, which stays the same (and is loaded into clusters once) across source changes.
FROM deps AS wheel
COPY pyproject.toml README.md /src/
COPY runtime /src/runtime
COPY operator /src/operator
RUN if [ -s /tmp/build-ca.crt ]; then export PIP_CERT=/tmp/build-ca.crt; fi \
 && pip wheel -q --no-deps -w /wheels /src

FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && groupadd --gid 65532 inferfleet && useradd --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home inferfleet
COPY --from=deps /opt/inferfleet /opt/inferfleet
COPY --from=wheel /wheels /wheels
ENV PATH=/opt/inferfleet/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN pip install -q --no-cache-dir --no-deps --no-index /wheels/*.whl && rm -rf /wheels \
 && python -c "import inferfleet_operator.controller.main" && ! python -c "import torch" 2>/dev/null
# Last step that needs a shell: remove them, so nothing at run time can depend on one.
RUN rm -f /usr/bin/sh /usr/bin/dash /usr/bin/bash /usr/bin/rbash /bin/sh /bin/dash /bin/bash
USER 65532:65532
ENTRYPOINT ["inferfleet-operator"]
