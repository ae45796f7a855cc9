# syntax=docker/dockerfile:1
# hotkeyd's image: a static binary on distroless, as user 65532.
#
#   docker build --build-arg VERSION=v1.2.3 -t hotkeyd:v1.2.3 .
#   docker run --rm -p 8080:8080 hotkeyd:v1.2.3 --nats-listen 0.0.0.0:4222
#
# deploy/deploy_test.go checks this file and runs its go build (docs/deploy.md).

FROM golang:1.26 AS build
WORKDIR /src
# The modules first, in a layer of their own: it is rebuilt only when
# go.mod or go.sum change, not on every change of the source.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/hotkeyd ./cmd/hotkeyd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/hotkeyd /usr/local/bin/hotkeyd
# distroless's nonroot user, by number so that Kubernetes' runAsNonRoot can
# check it.
USER 65532:65532
# Inside a container, listen on every interface. The embedded NATS server's
# address (HOTKEYD_NATS_LISTEN) is left to its loopback default: hotkeyd
# refuses it together with --nats, which a fleet uses; a single container
# that others join takes --nats-listen 0.0.0.0:4222.
ENV HOTKEYD_LISTEN=0.0.0.0:8080 \
    HOTKEYD_GRPC_LISTEN=0.0.0.0:8081
# HTTP API, gRPC (Envoy's rate-limit service), embedded NATS. The admin
# listener (/metrics, /v1/hotkeys) stays on loopback unless
# HOTKEYD_ADMIN_LISTEN is set, as the manifests and compose.yaml do.
EXPOSE 8080 8081 4222
ENTRYPOINT ["/usr/local/bin/hotkeyd"]
