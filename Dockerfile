# shardstock's image: the allocator and shard server binaries (static, no
# cgo) on a distroless base, run as a non-root user. The Kubernetes
# manifests (deploy/k8s) choose the binary with `command:`. Build it with
# `make image` (docker, podman or buildah).
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/allocator ./cmd/allocator && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/shard ./cmd/shard && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/stockctl ./cmd/stockctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/allocator /out/shard /out/stockctl /
USER 65532:65532
EXPOSE 8080 7001
ENTRYPOINT ["/allocator"]
