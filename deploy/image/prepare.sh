#!/bin/sh
# What every attnserve image starts from, on any Debian or Ubuntu base with python3 and its venv module:
#   prepare.sh CA_FILE
# 1. Trust the PEM certificates in CA_FILE (a file without one, like no-extra-ca.pem, changes nothing), in the
#    system bundle that OpenSSL and apt read, and in pip's configuration: pip releases that carry their own
#    certifi bundle (python:3.11-slim's) would not read the system bundle otherwise.
# 2. A venv at /opt/venv: Debian's and Ubuntu's Python refuse `pip install` into the system (PEP 668).
# 3. The user the servers run as, with a fixed uid so that volume permissions and security policies can name it.
set -eu
ca_file="$1"
if grep -q -- "-----BEGIN CERTIFICATE-----" "$ca_file"; then
    cp "$ca_file" /usr/local/share/ca-certificates/attnserve-extra.crt
    update-ca-certificates
fi
python3 -m venv /opt/venv
if grep -q -- "-----BEGIN CERTIFICATE-----" "$ca_file"; then
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /opt/venv/pip.conf
fi
groupadd --gid 10001 attnserve
useradd --uid 10001 --gid attnserve --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin attnserve
