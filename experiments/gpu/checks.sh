# Sourced by the GPU scripts here, from the repository root, before they write anything or start a
# run: a misspelt model, routing, batch list or time limit is refused at once, naming the valid
# choices (exit 2). Unchecked, a bad value reached run.py only when its turn came, after the runs
# before it had spent the device call, and a limit like `70s` broke the scripts' arithmetic.
# Each function takes the script's name (the message's prefix) first.

refuse() {  # who message...
  local who=$1; shift
  echo "$who: $*" >&2
  exit 2
}

check_model() {  # who what name: conf/model/<name>.yaml must exist
  [ -f "conf/model/$3.yaml" ] && return 0
  refuse "$1" "$2: no model '$3' (conf/model/*.yaml: $(cd conf/model && ls *.yaml | sed 's/.yaml$//' | tr '\n' ' '))"
}

check_routing() {  # who what routing: base/config.py's ROUTINGS, spelt out (no Python before env.sh)
  [[ "$3" == uniform || "$3" == skewed ]] && return 0
  refuse "$1" "$2: routing '$3' is not one of uniform skewed"
}

check_batches() {  # who what list: empty (the run's default) or a Hydra list of whole numbers
  [[ -z "$3" || "$3" =~ ^\[[1-9][0-9]*(,[1-9][0-9]*)*\]$ ]] && return 0
  refuse "$1" "$2: batch sizes '$3' are not a list like [16,64]"
}

check_seconds() {  # who NAME value: a whole number of seconds >= 1 (an unset knob is not checked)
  [ -z "$3" ] && return 0
  [[ "$3" =~ ^[1-9][0-9]*$ ]] && return 0
  refuse "$1" "$2='$3': a whole number of seconds >= 1"
}
