#!/usr/bin/env bash
# A Phi-3 checkpoint (config.json model_type phi3; q/k/v fused in qkv_proj,
# gate/up in gate_up_proj) into the Llama example, checked against an
# independent PyTorch Phi-3 (tests/phi3/reference.py, its own forward over
# the fused tensors). Python writes random float32 weights; train_model
# --model llama --load-weights DIR cuts the fused tensors on load
# (WeightsOptions::fused) under plans/llama.yaml: unsharded and at 2 and 4
# thread ranks with 2 kv heads and 1 (4 ranks replicate it), at 2 gloo
# processes and under --plan auto (2 kv heads), and into ZeRO-3 slices at
# {data: 2, model: 2} (1 kv head): float64 logits within 1e-10 of Python's,
# greedy text Python's, and at 4 ranks rank 0 copies exactly the bytes it
# copies from the same weights stored split (its shards' rows only). Then 3
# fine-tune steps at TP 2 save back (--save-weights): Phi-3's fused names
# and a config.json with model_type phi3, which Python loads to C++'s
# logits (1e-10). Under {pipe: 2} each stage loads its layers' parts (the
# losses of one process). A file whose fused rows disagree with config.json
# is one line naming the file and the tensor.
# usage: phi3.sh TRAIN_MODEL SHARDPLAN_CLI PLANS_DIR WORK_DIR
set -uo pipefail
train=$1 cli=$2 plans=$3 work=$4
. "$(dirname "$0")/llama_common.sh"
ref=$(dirname "$0")/../phi3/reference.py
rm -rf "$work" && mkdir -p "$work"
sed 's/^mesh: {model: auto}$/mesh: {data: 2, model: 2}\ndata_parallel: {zero: 3}/' "$plans/llama.yaml" >"$work/zero3.yaml"
grep -q "zero: 3" "$work/zero3.yaml" || { echo "FAIL plans/llama.yaml's mesh line moved: no ZeRO-3 plan"; exit 1; }
copied() { sed -n 's/^\(\[rank 0\] \)\{0,1\}loaded .*(rank 0 copied \([0-9]*\) bytes.*/\2/p' "$work/out.txt"; }

# The same weights with Llama's names (q/k/v and gate/up split), by Python.
split_copy() {  # PHI3_DIR LLAMA_DIR
  $py - "$(dirname "$ref")/../weights" "$1" "$2" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[1])
from interop import read_safetensors, write_safetensors
c = json.load(open(os.path.join(sys.argv[2], "config.json")))
h, kv = c["num_attention_heads"], c["num_key_value_heads"]
d = c["hidden_size"] // h
out = {}
for n, t in read_safetensors(os.path.join(sys.argv[2], "model.safetensors")).items():
    if n.endswith("qkv_proj.weight"):
        for x, part in zip("qkv", t.split([h * d, kv * d, kv * d])):
            out[n.replace("qkv_proj", x + "_proj")] = part.clone()
    elif n.endswith("gate_up_proj.weight"):
        for x, part in zip(("gate", "up"), t.chunk(2)):
            out[n.replace("gate_up_proj", x + "_proj")] = part.clone()
    else:
        out[n] = t
os.makedirs(sys.argv[3], exist_ok=True)
write_safetensors(os.path.join(sys.argv[3], "model.safetensors"), out)
json.dump(dict(c, model_type="llama", architectures=["LlamaForCausalLM"]), open(os.path.join(sys.argv[3], "config.json"), "w"))
PY
}

for kv in 2 1; do
  d=$work/kv$kv
  $py "$ref" write "$d" num_key_value_heads=$kv || exit 1
  split_copy "$d" "$d/split" || exit 1
  want=$($py "$ref" greedy "$d" "$prompt" $n)
  files=() names=()
  runs=("1" "2" "4")
  # One gloo run; kv_heads 1 at 4 threads replicates it, and loads into
  # ZeRO-3 slices under {data: 2, model: 2}; --plan auto cuts it as a Llama.
  if [ $kv = 1 ]; then runs+=("4 zero3"); else runs+=("2 gloo" "2 auto"); fi
  for run in "${runs[@]}"; do
    set -- $run
    file=$d/logits_$1_${2:-threads}.safetensors name="kv_heads $kv, ${2:-threads} $1"
    args=(--load-weights "$d" --dump-logits "$file")
    if [ "${2:-}" = gloo ]; then
      text=$(gen "$cli" launch -n "$1" --backend gloo -- "${args[@]}" --plan "$plans/llama.yaml")
    elif [ "${2:-}" = zero3 ]; then
      text=$(gen "${args[@]}" --ranks "$1" --plan "$work/zero3.yaml")
      grep -q "into its ZeRO-3 slices" "$work/out.txt" || text="(not loaded into ZeRO-3 slices)"
    elif [ "${2:-}" = auto ]; then
      text=$(gen "${args[@]}" --ranks "$1" --plan auto)
      ! grep -q "found nothing to shard" "$work/out.txt" || text="(--plan auto cut nothing)"
    elif [ "$1" = 1 ]; then
      text=$(gen "${args[@]}")
    else
      text=$(gen "${args[@]}" --ranks "$1" --plan "$plans/llama.yaml")
    fi
    check "$name, greedy" "$want" "$text"
    files+=("$file") names+=("$name")
    if [ "$1" = 4 ] && [ -z "${2:-}" ]; then  # rank 0 reads its rows of each part only
      fused_bytes=$(copied)
      gen --load-weights "$d/split" --ranks "$1" --plan "$plans/llama.yaml" >/dev/null
      [ -n "$fused_bytes" ] || fused_bytes="(no 'loaded ... copied N bytes' line)"
      check "$name, bytes rank 0 copied (fused = split file)" "$(copied)" "$fused_bytes"
    fi
  done
  out=$($py "$ref" logits "$d" "$prompt" "${files[@]}") && mapfile -t diffs <<<"$out" || diffs=()
  [ ${#diffs[@]} -eq ${#files[@]} ] || { echo "FAIL kv_heads $kv: not compared: $out"; failures=$((failures + 1)); }
  for ((i = 0; i < ${#diffs[@]}; ++i)); do within "${names[$i]}" 1e-10 "${diffs[$i]}"; done
done

# A pipeline's stages each load their layers' parts: 3 steps under {pipe: 2}
# lose what one process loses.
losses() { "$train" --model llama --dtype float64 --steps 3 --log-every 1 --batch 8 --load-weights "$work/kv2" "$@" 2>&1 |
  sed -n 's/^\(\[rank 0\] \)\{0,1\}step *\([0-9]*\) *loss \([0-9.]*\).*/\2 \3/p' | tr '\n' ' '; }
one=$(losses)
[ -n "$one" ] || one="(no losses)"
check "{pipe: 2} losses (plans/llama_pipe.yaml)" "$one" "$(losses --ranks 2 --plan "$plans/llama_pipe.yaml")"

# Fine-tune at TP 2, save back as Phi-3, read by Python.
"$train" --model llama --steps 3 --log-every 3 --batch 4 --dtype float64 --ranks 2 --plan "$plans/llama.yaml" \
  --load-weights "$work/kv1" --save-weights "$work/tuned" >"$work/tune.txt" 2>&1 || { cat "$work/tune.txt"; exit 1; }
check "saved config.json model_type" phi3 "$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_type"])' "$work/tuned/config.json")"
want=$($py "$ref" greedy "$work/tuned" "$prompt" $n) || want="(Python could not load it)"
check "fine-tuned, read back by Python" "$want" \
  "$(gen --load-weights "$work/tuned" --ranks 2 --plan "$plans/llama.yaml" --dump-logits "$work/tuned.safetensors")"
diff=$($py "$ref" logits "$work/tuned" "$prompt" "$work/tuned.safetensors") || diff="1 (not compared)"
within "fine-tuned, read back by Python" 1e-10 "$diff"
moved=$($py "$ref" logits "$work/kv1" "$prompt" "$work/tuned.safetensors") || moved=0
if at_most "${moved%% *}" 1e-6; then
  echo "FAIL fine-tune: the saved weights compute the loaded ones' logits ($moved)"
  failures=$((failures + 1))
else
  echo "ok   fine-tuned: its logits moved from the loaded weights' (${moved%% *})"
fi

# config.json says 2 kv heads, the file's qkv_proj has rows for 1.
mkdir -p "$work/bad" && cp "$work/kv1/model.safetensors" "$work/bad/"
$py -c "import json,sys; c=json.load(open(sys.argv[1])); c['num_key_value_heads']=2; json.dump(c, open(sys.argv[2],'w'))" \
  "$work/kv1/config.json" "$work/bad/config.json"
if "$train" --model llama --steps 0 --load-weights "$work/bad" >"$work/bad.txt" 2>&1 ||
  ! grep -q "weights '$work/bad/model.safetensors': tensor 'model.layers.0.self_attn.qkv_proj.weight': .*rows 32 + 16 + 16 do not sum to its 48 rows" "$work/bad.txt"; then
  echo "FAIL fused rows against config.json: not refused as expected:"
  cat "$work/bad.txt"
  failures=$((failures + 1))
else
  echo "ok   fused rows against config.json: $(grep error "$work/bad.txt")"
fi
exit $((failures > 0))
