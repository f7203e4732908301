#!/usr/bin/env bash
# Checks everything that ships leaderd besides the Rust code: the Helm chart
# (lint, render both patterns, strict manifest validation, schema rejects a
# wrong type), the Dockerfile (hadolint), the systemd unit (systemd-analyze
# verify, silent), every shell script (shellcheck) and the chart's static
# YAML (yamllint). Installs its own tools, pinned; needs only the package
# registries. Run from anywhere: bash .ci/lint-packaging.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly CHART=helm/leaderd
readonly VENV=target/ci-venv
readonly OUT=target/ci-packaging
readonly REQUIREMENTS=.ci/packaging/requirements.txt
# Debian 12 versions. apt keeps only the current ones: bump these when a
# point release replaces them.
readonly APT_PINS=(shellcheck=0.9.0-1 systemd=252.39-1~deb12u2 prometheus=2.42.0+ds-5+deb12u1)

step() { printf '\n== %s\n' "$*"; }

install_debian_packages() {
    local pin pkg want have missing=()
    for pin in "${APT_PINS[@]}"; do
        pkg=${pin%%=*}
        want=${pin#*=}
        have=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
        [[ $have == "$want" ]] || missing+=("$pin")
    done
    if ((${#missing[@]})); then
        step "apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            --allow-downgrades "${missing[@]}"
    fi
}

install_python_tools() {
    # Reinstall only when the pins change: a stamp holds the requirements'
    # hash.
    local stamp=$VENV/.requirements.sha256 want
    want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
    if [[ -x $VENV/bin/python && -f $stamp && $(<"$stamp") == "$want" ]]; then
        return
    fi
    step "pip install -r $REQUIREMENTS into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$REQUIREMENTS"
    "$VENV/bin/python" -m pip check
    echo "$want" >"$stamp"
}

check_chart() {
    local py=$VENV/bin/python values name dir sm rule
    local -a value_sets=(- "$CHART"/ci/*-values.yaml)

    step "helm lint (Helm $("$py" -c 'import helm_python as h; print(h.helm_sdk_version())') Go SDK)"
    "$py" .ci/packaging/chart.py lint "$CHART" "$CHART"/ci/*-values.yaml

    rm -rf "$OUT"
    for values in "${value_sets[@]}"; do
        if [[ $values == - ]]; then name=defaults; else name=$(basename "$values" -values.yaml); fi
        dir=$OUT/$name
        step "render $CHART with ${values/#-/default values} -> $dir"
        "$py" .ci/packaging/chart.py render "$CHART" "$values" "$dir"

        # The oldest Kubernetes we claim to support, and the newest schemas
        # kubernetes-validate ships.
        for kube in 1.29.0 1.37.0; do
            step "kubernetes-validate --strict -k $kube ($name)"
            "$VENV/bin/kubernetes-validate" --strict -k "$kube" "$dir"/k8s/*.yaml
        done

        # kubernetes-validate only knows Kubernetes' own kinds: it would merely
        # warn about a ServiceMonitor or a PrometheusRule. Check those against
        # the operator's CRD models instead.
        mapfile -t sm < <(find "$dir/crd" -name '*.yaml' | sort)
        if ((${#sm[@]})); then
            step "prometheus-operator schemas ($name)"
            "$py" .ci/packaging/chart.py crd-validate "${sm[@]}"
        fi

        # The rules as the chart ships them (with its `for` and labels), not
        # only the source file the test suite unit-tests.
        for rule in "$dir"/crd/prometheusrule-*.yaml; do
            [[ -e $rule ]] || continue
            step "promtool check rules $rule"
            "$py" .ci/packaging/chart.py rule-file "$rule" "$dir/rules.yaml"
            promtool check rules "$dir/rules.yaml"
        done
    done

    step "chart README lists every value"
    "$py" .ci/packaging/chart.py readme "$CHART"

    step "values.schema.json rejects a wrong type"
    "$py" .ci/packaging/chart.py reject "$CHART" .ci/packaging/wrong-type-values.yaml

    step "yamllint (chart's static YAML)"
    "$VENV/bin/yamllint" --strict -c .ci/yamllint.yaml \
        "$CHART/Chart.yaml" "$CHART/values.yaml" "$CHART"/ci/*.yaml "$CHART"/files/*.yaml
}

check_dockerfile() {
    step "hadolint Dockerfile"
    "$VENV/bin/hadolint" --failure-threshold warning Dockerfile
    # hadolint cannot see through `FROM ${BUILDER}`: the default that users
    # build with must stay pinned by tag and digest.
    step "Dockerfile: the default builder is pinned by tag and digest"
    grep -Eq '^ARG BUILDER=[^@:[:space:]]+:[^@[:space:]]+@sha256:[0-9a-f]{64}$' Dockerfile || {
        grep -n '^ARG BUILDER' Dockerfile >&2 || echo "no ARG BUILDER" >&2
        echo "ARG BUILDER must default to image:tag@sha256:<digest>" >&2
        return 1
    }
    echo "  $(sed -n 's/^ARG BUILDER=//p' Dockerfile)"
}

check_systemd_unit() {
    # `verify` wants ExecStart's binary to exist. Rather than edit the unit,
    # verify it unchanged inside a scratch root that holds a stand-in
    # /usr/local/bin/leaderd and the host's own system units (for the targets
    # the unit refers to). verify exits 0 on warnings, so any output fails.
    local root unit=config/systemd/leaderd@.service output
    step "systemd-analyze verify $unit"
    root=$(mktemp -d)
    trap 'rm -rf "$root"' RETURN
    mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
    printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/leaderd"
    chmod 0755 "$root/usr/local/bin/leaderd"
    cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
    cp "$unit" "$root/etc/systemd/system/"
    if ! output=$(systemd-analyze verify --root="$root" \
        "$root/etc/systemd/system/leaderd@.service" 2>&1) || [[ -n $output ]]; then
        printf '%s\n' "$output"
        echo "systemd-analyze verify: the unit must verify with no output" >&2
        return 1
    fi
    echo "  no findings"
}

check_shell_scripts() {
    local -a scripts
    mapfile -t scripts < <(git ls-files -co --exclude-standard -- '*.sh')
    step "shellcheck ${#scripts[@]} script(s)"
    shellcheck --version | sed -n 2p
    shellcheck "${scripts[@]}"
}

install_debian_packages
install_python_tools
check_chart
check_dockerfile
check_systemd_unit
check_shell_scripts
step "packaging checks passed"
