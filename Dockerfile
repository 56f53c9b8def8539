FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake git && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ENV CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
RUN pip install --no-cache-dir '.[native]'
