# A kind node image assembled from parts, for hosts where kindest/node cannot be pulled. The
# context (made by e2e/kind/node-image.sh) holds kind's own images/base/files from its Go module,
# the pinned Kubernetes binaries, crictl and our prelude; the packages come from Debian bookworm
# (containerd 1.6, runc, CNI plugins). node-image.sh then imports the control-plane images into
# its containerd and commits the result.
ARG BASE_IMAGE=debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      systemd systemd-sysv dbus conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz bash ca-certificates curl jq procps socat \
      containerd runc containernetworking-plugins \
 && rm -rf /var/lib/apt/lists/* \
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init
COPY files/ /
ARG K8S_VERSION
ARG PAUSE_VERSION
# kind's containerd.service starts /usr/local/bin/containerd; Debian installs /usr/bin/containerd.
# The sandbox image is the pause kubeadm names (node-image.sh imports it).
RUN chmod 755 /kind /kind/bin /kind/bin/* /usr/local/bin/* /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl \
 && ln -sf /usr/bin/containerd /usr/local/bin/containerd \
 && mkdir -p /opt/cni/bin && ln -sf /usr/lib/cni/* /opt/cni/bin/ \
 && ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \
 && sed -i "s|sandbox_image = .*|sandbox_image = \"registry.k8s.io/pause:${PAUSE_VERSION}\"|" /etc/containerd/config.toml \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && mkdir -p /etc/kubernetes/manifests \
 && echo "${K8S_VERSION}" > /kind/version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/inferfleet-node-prelude", "/usr/local/bin/entrypoint", "/sbin/init"]
