# onehop agent images. Two targets:
#   docker build -t onehop/agent:latest .                       # nftables (default, last stage)
#   docker build -t onehop/agent:latest-ipvs --target ipvs .    # IPVS
# The binary is static (CGO_ENABLED=0). The nftables dataplane talks netlink
# itself and needs no userspace tool, so its image is distroless/static. The
# IPVS dataplane programs masquerade and filter rules with iptables, so its
# image carries iptables (Debian's, iptables-nft by default; the legacy
# variant is there too for `agent cleanup --kube-proxy-leftovers`).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
	-ldflags "-s -w -X main.version=${VERSION}" \
	-o /out/agent ./cmd/agent

FROM debian:bookworm-slim AS ipvs
RUN apt-get update \
	&& apt-get install -y --no-install-recommends iptables \
	&& rm -rf /var/lib/apt/lists/*
COPY --from=build /out/agent /usr/local/bin/agent
ENTRYPOINT ["/usr/local/bin/agent"]

# Root (the default user of this image): added capabilities only take
# effect for root.
FROM gcr.io/distroless/static-debian12 AS nftables
COPY --from=build /out/agent /usr/local/bin/agent
ENTRYPOINT ["/usr/local/bin/agent"]
