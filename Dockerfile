# onehop agent images. Two targets:
#   docker build -t onehop/agent:v0.1.0 .                       # nftables (default, last stage)
#   docker build -t onehop/agent:v0.1.0-ipvs --target ipvs .    # IPVS
# The binary is static (CGO_ENABLED=0). The nftables dataplane talks netlink
# itself and needs no userspace tool, so its image is the binary alone (FROM
# scratch: no base image to pin or patch; test/node runs this layout on real
# kubelets). The
# IPVS dataplane programs masquerade and filter rules with iptables, so its
# image carries iptables (Debian's, iptables-nft by default; the legacy
# variant is there too for `agent cleanup --kube-proxy-leftovers`).

# Base images by tag for development; a release build passes them pinned by
# digest (a tag can move under a rebuild):
#   --build-arg GO_IMAGE=golang:1.26@sha256:... --build-arg DEBIAN_IMAGE=debian:bookworm-slim@sha256:...
ARG GO_IMAGE=golang:1.26
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
	-ldflags "-s -w -X main.version=${VERSION}" \
	-o /out/agent ./cmd/agent

FROM ${DEBIAN_IMAGE} AS ipvs
RUN apt-get update \
	&& apt-get install -y --no-install-recommends iptables \
	&& rm -rf /var/lib/apt/lists/*
COPY --from=build /out/agent /usr/local/bin/agent
ENTRYPOINT ["/usr/local/bin/agent"]

# Root (the default user of an image without /etc/passwd): added
# capabilities only take effect for root.
FROM scratch AS nftables
COPY --from=build /out/agent /usr/local/bin/agent
ENTRYPOINT ["/usr/local/bin/agent"]
