#!/usr/bin/env bash
# Checks commit subjects: at most 72 characters, in the `area: summary` form, for every
# commit since the rule was set (older subjects are history and stay as they are).
#
#   scripts/check-commits.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The last commit before the rule held; every commit after it is checked.
RULE_SINCE=b1e07db88f07642c002449f852aae4c89249ecbf

if ! git cat-file -e "$RULE_SINCE^{commit}" 2>/dev/null; then
  echo "check-commits: $RULE_SINCE is not in this clone (a shallow clone?); nothing checked"
  exit 0
fi
bad=0
while IFS= read -r line; do
  hash=${line%% *}
  subject=${line#* }
  if (( ${#subject} > 72 )); then
    echo "check-commits: $hash: subject of ${#subject} characters (at most 72): $subject"
    bad=1
  fi
  if ! [[ $subject =~ ^[a-z0-9_./,\ -]+:\ [^\ ] ]]; then
    echo "check-commits: $hash: subject not in the form \"area: summary\": $subject"
    bad=1
  fi
done < <(git log --no-merges --format='%h %s' "$RULE_SINCE..HEAD")
if (( bad )); then
  exit 1
fi
echo "check-commits: ok ($(git rev-list --count --no-merges "$RULE_SINCE..HEAD") commits since the rule)"
