#!/usr/bin/env bash
# `make images`: builds the operator image (operator/Dockerfile) and the trainer image
# (trainer_image/Dockerfile) with docker or podman, whichever is installed, and says how to use them.
#     IMAGE_REPOSITORY  where they go: <repository>/operator and <repository>/trainer (ghcr.io/largebatch)
#     IMAGE_TAG         their tag (the version in pyproject.toml, which is the chart's appVersion)
#     BASE              the Dockerfiles' base image (their default: python:3.12-slim); without Docker Hub,
#                       BASE=$(dev/base_image.sh) makes one from Debian's packages
#     PUSH=1            push both after building
#     BUILD_FLAGS       more flags for the build (e.g. --network host where the engine has no bridge)
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${CONTAINER_ENGINE:-$(command -v docker || command -v podman || true)}
[ -n "$engine" ] || { echo "error: neither docker nor podman is installed" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
repository=${IMAGE_REPOSITORY:-ghcr.io/largebatch}
tag=${IMAGE_TAG:-$version}
operator=$repository/operator:$tag
trainer=$repository/trainer:$tag
args=()
[ -z "${BASE:-}" ] || args+=(--build-arg "BASE=$BASE")
# shellcheck disable=SC2206  # BUILD_FLAGS is a list of flags
args+=(${BUILD_FLAGS:-})

"$engine" build "${args[@]}" -f operator/Dockerfile -t "$operator" .
"$engine" build "${args[@]}" -f trainer_image/Dockerfile -t "$trainer" .
if [ "${PUSH:-0}" = 1 ]; then
    "$engine" push "$operator"
    "$engine" push "$trainer"
fi

cat <<USE

Built $operator and $trainer.
$( [ "${PUSH:-0}" = 1 ] || echo "Push them where your cluster pulls from:  $engine push $operator && $engine push $trainer" )
Install the operator with its image:
    helm install largebatch charts/largebatch -n largebatch-system --create-namespace \\
        --set image.repository=$repository/operator,image.tag=$tag
and give each LargeBatchJob the trainer image:
    spec:
      image: $trainer
USE
