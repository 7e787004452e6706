# Sourced by the bigger-than-rank tests (llama_bigger_than_rank*.sh), which
# set $work. peak_vmdata CMD...: runs CMD to the end and prints the largest
# VmData (kB; what prlimit --data limits) any process whose command line
# names "$work/w --steps" had meanwhile; 0 if CMD failed (its output on stderr).
peak_vmdata() {
  "$@" >"$work/peak.txt" 2>&1 &
  local pid=$! peak=0 v p
  while kill -0 $pid 2>/dev/null; do
    for p in $(pgrep -f -- "$work/w --steps"); do
      v=$(awk '/^VmData/{print $2}' /proc/$p/status 2>/dev/null)
      [ -n "$v" ] && [ "$v" -gt "$peak" ] && peak=$v
    done
    sleep 0.02
  done
  wait $pid || { cat "$work/peak.txt" >&2; echo 0; return; }
  echo $peak
}
