#!/bin/sh
# Test agent in plain shell: report what id-tracker handed over, call the
# router's OpenAI surface with curl using that key, exit with $1.
echo "agent=$KAIROS_AGENT_ID"
echo "base=$OPENAI_BASE_URL"
echo "litellm=$HOSTED_VLLM_API_BASE"
echo "anthropic=$ANTHROPIC_BASE_URL"
curl -sS -f -H "Authorization: Bearer $OPENAI_API_KEY" "$OPENAI_BASE_URL/models" >/dev/null || exit 99
# Anthropic-style clients send the key in x-api-key to $ANTHROPIC_BASE_URL/v1/...
curl -sS -f -H "x-api-key: $ANTHROPIC_API_KEY" "$ANTHROPIC_BASE_URL/v1/models" >/dev/null || exit 98
exit "$1"
