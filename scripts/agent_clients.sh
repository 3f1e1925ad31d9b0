#!/usr/bin/env bash
# Set up the real agent clients of the real-engine tier once
# (tests/realvllm/test_agent_clients.py, docs/agents.md), beside the vLLM environment:
#   .cache/realvllm-agent-model   the tier's tiny model with a 64K window and replies
#                                 that end (scripts/realvllm_agent_model.py)
#   .cache/agent-clients/npm      Claude Code and the Codex CLI, pinned, from npm
#   .cache/agent-clients/mswea    mini-swe-agent, pinned, in its own venv (it pulls LiteLLM)
# Idempotent: each finished step leaves a stamp and is skipped next time. Whatever
# cannot be installed here (no Node >= 18 or npm, a disk too full, no vLLM
# environment) is a stated skip: the reason goes to a file the tests read and
# print, never a half-finished install.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${KAIROS_REALVLLM_CACHE:-.cache}"
CLIENTS="$CACHE/agent-clients"
PYTHON="${PYTHON:-python3}"
CLAUDE_CODE="@anthropic-ai/claude-code@2.1.332"
CODEX="@openai/codex@0.171.0"
MSWEA="mini-swe-agent==2.4.6"
NPM_STAMP="$CLAUDE_CODE $CODEX"
NPM_DIR="$CLIENTS/npm"
MSWEA_DIR="$CLIENTS/mswea"
NPM_NEED_MB="${KAIROS_AGENT_CLIENTS_NPM_MB:-1200}"  # 0.81 GB installed, native binaries
MSWEA_NEED_MB="${KAIROS_AGENT_CLIENTS_MSWEA_MB:-900}"  # 0.57 GB installed
for need in "$NPM_NEED_MB" "$MSWEA_NEED_MB"; do
  if ! [[ "$need" =~ ^[0-9]+$ ]]; then
    echo "agent-clients: KAIROS_AGENT_CLIENTS_NPM_MB and KAIROS_AGENT_CLIENTS_MSWEA_MB must be whole numbers of MB, got '$need'" >&2
    exit 2
  fi
done
mkdir -p "$CLIENTS"

free_mb() { df -Pm "$CLIENTS" | awk 'NR == 2 {print $4}'; }

# skip NAME REASON: leave the reason where the tests find it, and say it
skip() {
  echo "$2" > "$CLIENTS/$1-unavailable"
  echo "agent-clients: $2: not installing $1; its tests will skip" >&2
}

# -- the model the clients talk to (needs the vLLM environment, scripts/realvllm_env.sh)
AGENT_MODEL="$CACHE/realvllm-agent-model"
if [ -x "$CACHE/vllm-venv/bin/python" ] && [ -f "$CACHE/realvllm-model/kairos-model.json" ]; then
  if [ ! -f "$AGENT_MODEL/kairos-model.json" ] \
    || [ scripts/realvllm_agent_model.py -nt "$AGENT_MODEL/kairos-model.json" ] \
    || [ "$CACHE/realvllm-model/kairos-model.json" -nt "$AGENT_MODEL/kairos-model.json" ]; then
    "$CACHE/vllm-venv/bin/python" scripts/realvllm_agent_model.py "$CACHE/realvllm-model" "$AGENT_MODEL"
  fi
fi

# -- Claude Code and the Codex CLI: Node programs whose packages carry native binaries
rm -f "$CLIENTS/npm-unavailable"
# Node and npm from Debian's packages where they are missing and this runs as root
# with apt (a bare CI machine; Debian 12 ships Node 18), as scripts/scaleout_env.sh
# does for its services; elsewhere a stated skip below.
if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "agent-clients: installing nodejs and npm (Debian packages; once)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) \
    || echo "agent-clients: could not install nodejs and npm" >&2
fi
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$(cat "$NPM_DIR/.installed" 2>/dev/null)" = "$NPM_STAMP" ]; then
  :
elif ! command -v npm >/dev/null 2>&1 || [ "$node_major" -lt 18 ]; then
  skip npm "Claude Code and the Codex CLI need Node >= 18 and npm (found node ${node_major:-none}, npm $(command -v npm || echo none))"
elif [ "$(free_mb)" -lt "$NPM_NEED_MB" ]; then
  skip npm "only $(free_mb) MB free on the disk of $CLIENTS; Claude Code and the Codex CLI need ${NPM_NEED_MB} MB"
else
  rm -rf "$NPM_DIR"
  mkdir -p "$NPM_DIR"
  echo '{"private": true}' > "$NPM_DIR/package.json"
  echo "agent-clients: installing $NPM_STAMP into $NPM_DIR (once; about 0.8 GB)" >&2
  # Claude Code's package declares node >= 22 but runs a native binary that its
  # postinstall copies in place; the Codex launcher picks its platform package.
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error --engine-strict=false \
    "$CLAUDE_CODE" "$CODEX"
  # The native binary is copied in by Claude Code's postinstall; an npm that holds
  # install scripts back leaves its placeholder: run the postinstall ourselves.
  if ! "$NPM_DIR/node_modules/.bin/claude" --version >/dev/null 2>&1; then
    (cd "$NPM_DIR/node_modules/@anthropic-ai/claude-code" && node install.cjs)
  fi
  got_claude=$("$NPM_DIR/node_modules/.bin/claude" --version)
  got_codex=$("$NPM_DIR/node_modules/.bin/codex" --version)
  if [[ "$got_claude" != "${CLAUDE_CODE##*@}"* ]] || [[ "$got_codex" != *"${CODEX##*@}" ]]; then
    echo "agent-clients: installed clients report '$got_claude' and '$got_codex', not $NPM_STAMP" >&2
    exit 1
  fi
  echo "$NPM_STAMP" > "$NPM_DIR/.installed"
fi

# -- mini-swe-agent: Python, LiteLLM underneath; its own venv, not the project's
rm -f "$CLIENTS/mswea-unavailable"
if [ "$(cat "$MSWEA_DIR/.installed" 2>/dev/null)" = "$MSWEA" ]; then
  :
elif [ "$(free_mb)" -lt "$MSWEA_NEED_MB" ]; then
  skip mswea "only $(free_mb) MB free on the disk of $CLIENTS; mini-swe-agent needs ${MSWEA_NEED_MB} MB"
else
  rm -rf "$MSWEA_DIR"
  echo "agent-clients: installing $MSWEA into $MSWEA_DIR (once; about 0.6 GB)" >&2
  "$PYTHON" -m venv "$MSWEA_DIR"
  "$MSWEA_DIR/bin/python" -m pip install --quiet --no-compile "$MSWEA"
  echo "$MSWEA" > "$MSWEA_DIR/.installed"
fi
