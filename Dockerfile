# syntax=docker/dockerfile:1
# Multi-stage build: dependencies are compiled in their own layer, so a change to the
# service's code rebuilds only the service. The runtime image is distroless (glibc, CA
# certificates, no shell) and runs as a non-root user.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependency layer: a stub crate with the real manifests, so `cargo build` fetches and
# compiles every dependency; it is reused until Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src
COPY openapi.yaml ./
COPY src ./src
# The stub's build artefacts are older than the real sources; make sure cargo sees that.
RUN touch src/main.rs src/lib.rs && cargo build --release --locked

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/proxy-allocator /usr/local/bin/proxy-allocator
# Inside a container the service must listen on every interface, not just loopback; there
# it refuses to start without a worker token (WORKER_TOKEN or WORKER_TOKEN_FILE). The probes
# have their own port, which a flood of the API port cannot fill.
ENV LISTEN_ADDR=0.0.0.0:8080 \
    PROBE_LISTEN=0.0.0.0:9090 \
    LOG_FORMAT=json
EXPOSE 8080 9090
USER nonroot:nonroot
# There is no shell or curl in the image: the binary checks its own /livez.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/proxy-allocator", "healthcheck", "--url", "http://127.0.0.1:9090/livez"]
ENTRYPOINT ["/usr/local/bin/proxy-allocator"]
CMD ["serve"]
