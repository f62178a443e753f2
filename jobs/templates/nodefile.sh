# >>> nodefile: the allocation's node file without the excluded hosts (PBS and NQSV).
# Included verbatim in the job script; the tests run it against a fake $PBS_NODEFILE.
# benchfs_filter_nodefile SRC DEST [HOST...]: copy SRC's lines to DEST, leaving out every line
# whose host (or its short name, before the first dot) is one of HOST. Fails if none is left.
benchfs_filter_nodefile() {
  local src=$1 dest=$2 line host kept=0 ex skip
  shift 2
  if [ ! -r "$src" ]; then
    echo "benchfs job: node file '$src' is not readable" >&2
    return 1
  fi
  : > "$dest" || return 1
  while IFS= read -r line || [ -n "$line" ]; do
    host=${line%%[[:space:]]*}
    [ -n "$host" ] || continue
    skip=0
    for ex in "$@"; do
      if [ "$host" = "$ex" ] || [ "${host%%.*}" = "${ex%%.*}" ]; then
        skip=1
        break
      fi
    done
    if [ "$skip" -eq 0 ]; then
      printf '%s\n' "$line" >> "$dest"
      kept=$((kept + 1))
    fi
  done < "$src"
  if [ "$kept" -eq 0 ]; then
    echo "benchfs job: every host of '$src' is excluded; nothing to run on" >&2
    return 1
  fi
}
# <<< nodefile
