#!/bin/sh
# gateway-tls: nginx terminating TLS in front of the gateways (tls-proxy.conf). The key pair is
# /tls/cert.pem and /tls/key.pem: an operator's own, or, when absent, a self-signed one made here
# for GRID_TLS_NAME, localhost and 127.0.0.1 (clients then verify against /tls/cert.pem).
set -eu
if [ ! -s /tls/cert.pem ] || [ ! -s /tls/key.pem ]; then
    name="${GRID_TLS_NAME:-localhost}"
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
        -subj "/CN=$name" -addext "subjectAltName=DNS:$name,DNS:localhost,DNS:gateway-tls,IP:127.0.0.1" \
        -keyout /tls/key.pem.new -out /tls/cert.pem.new 2>/dev/null
    chmod 644 /tls/cert.pem.new
    mv /tls/key.pem.new /tls/key.pem
    mv /tls/cert.pem.new /tls/cert.pem
    echo "gateway-tls: made a self-signed certificate for $name (/tls/cert.pem)"
fi
exec nginx -e stderr -c /opt/grid/deploy/tls-proxy.conf -g 'daemon off;'
