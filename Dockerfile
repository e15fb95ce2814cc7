# syntax=docker/dockerfile:1
# The seckill service: one static binary (HTTP API and order worker) in a
# small image that runs as a non-root user. docker-compose.yml builds it.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
# Only what the binary is built from: no local data, state or binaries.
COPY cmd ./cmd
COPY internal ./internal
COPY lua ./lua
COPY sql ./sql
# The API description, embedded in the binary (docs/docs.go); not the guides beside it.
COPY docs/docs.go docs/openapi.yaml ./docs/
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/api ./cmd/api

# Alpine rather than scratch for busybox wget, which the health checks use.
FROM alpine:3.22
RUN adduser -D -H -u 10001 seckill
COPY --from=build /out/api /usr/local/bin/api
USER 10001:10001
EXPOSE 8080
ENV SECKILL_ADDR=:8080
ENTRYPOINT ["/usr/local/bin/api"]
CMD ["serve"]
