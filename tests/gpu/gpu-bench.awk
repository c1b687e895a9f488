# make gpu-bench's table and JSON (tests/gpu/gpu-bench.sh runs it; POSIX awk, no gawk needed).
# Reads three files, in this order:
#   1. PyTorch's JSON lines from torch_compare.py (may be empty): {"bench": "torch", ...} first,
#      then records {"bench", "case", "ms", "tflops"[, "tokens_per_s"]} or {"bench": "skipped",
#      "case", "why"} ("case": "*" for every case);
#   2. trident's cases, one a line, tab-separated: case, bench, shape, "ok" or "failed", then
#      trident's JSON record (`trident bench ... --json`) or why the bench failed;
#   3. what the shell script skipped, tab-separated: what, why.
# Writes the table to stdout and the JSON object to the file `out` (-v out=PATH). Every ratio is
# trident / PyTorch; MFU is each side's TFLOP/s over the device's dense bf16 datasheet peak that
# trident's records carry ("peak"; null for a device not in src/gpu/peaks.rs). A value that is
# missing is "-" in the table and null in the JSON.
BEGIN {
    FS = "\t"
    ncases = 0
    nskips = 0
    torch_header = "null"
    torch_all = ""
}

# Which input this line is from (an empty file has no lines, so FNR cannot count files).
FNR == 1 { file = (FILENAME == ARGV[1]) ? 1 : (FILENAME == ARGV[2]) ? 2 : 3 }

file == 1 && /^[ \t]*\{/ {
    bench = str($0, "bench")
    if (bench == "torch") {
        torch_header = $0
        torch_name = str($0, "torch")
        next
    }
    c = str($0, "case")
    if (bench == "skipped") {
        if (c == "*") torch_all = str($0, "why")
        else torch_why[c] = str($0, "why")
        next
    }
    torch_rec[bench SUBSEP c] = $0  # by bench and case: a step and an attention case may share a name
    next
}

file == 2 && NF >= 5 {
    ncases++
    case_id[ncases] = $1
    case_bench[ncases] = $2
    case_shape[ncases] = $3
    if ($4 == "ok") {
        trident_rec[ncases] = $5
        if (device == "") {
            device = str($5, "device")
            device_kind = str($5, "device_kind")
            peak = num($5, "peak")
        }
    } else {
        skip("trident " $2 " " $1, $5)
    }
    next
}

file == 3 && NF >= 2 { skip($1, $2) }

END {
    if (torch_all != "") skip("PyTorch (every comparison)", torch_all)
    if (device != "" && peak == "") skip("MFU", "no datasheet peak for " device " in src/gpu/peaks.rs")
    header = sprintf("%-10s %-18s %-28s %11s %11s %10s %14s %14s %12s %13s %13s %11s %11s %11s", \
        "bench", "case", "shape", "trident_ms", "torch_ms", "time_ratio", "trident_tflops", "torch_tflops", \
        "tflops_ratio", "trident_tok/s", "torch_tok/s", "tok/s_ratio", "trident_mfu", "torch_mfu")
    print "gpu-bench on " (device == "" ? "no GPU" : device " (" device_kind ")") \
        ", dense bf16 peak " (peak == "" ? "unknown" : peak " TFLOP/s (datasheet)") \
        "; PyTorch " (torch_name == "" ? "absent" : torch_name)
    print "ratios are trident / PyTorch: time_ratio below 1, tflops_ratio and tok/s_ratio above 1 mean trident is faster"
    print header
    rows = ""
    for (i = 1; i <= ncases; i++) {
        c = case_id[i]
        t = trident_rec[i]
        p = ((case_bench[i], c) in torch_rec) ? torch_rec[case_bench[i], c] : ""
        if (p == "" && torch_all == "") {
            skip("PyTorch " case_bench[i] " " c, (c in torch_why) ? torch_why[c] : "torch_compare.py wrote no record for it")
        }
        tms = num(t, "ms"); pms = num(p, "ms")
        ttf = num(t, "achieved"); ptf = num(p, "tflops")
        ttok = num(t, "tokens_per_s"); ptok = num(p, "tokens_per_s")
        tmfu = ratio(ttf, peak); pmfu = ratio(ptf, peak)
        v[1] = tms; v[2] = pms; v[3] = ratio(tms, pms)
        v[4] = ttf; v[5] = ptf; v[6] = ratio(ttf, ptf)
        v[7] = ttok; v[8] = ptok; v[9] = ratio(ttok, ptok)
        v[10] = tmfu; v[11] = pmfu
        printf "%-10s %-18s %-28s %11s %11s %10s %14s %14s %12s %13s %13s %11s %11s %11s\n", \
            case_bench[i], c, case_shape[i], cell(v[1]), cell(v[2]), cell(v[3]), cell(v[4]), cell(v[5]), \
            cell(v[6]), cell(v[7]), cell(v[8]), cell(v[9]), cell(v[10]), cell(v[11])
        rows = rows (i > 1 ? ",\n    " : "    ") \
            "{\"bench\": " q(case_bench[i]) ", \"case\": " q(c) ", \"shape\": " q(case_shape[i]) \
            ", \"trident_ms\": " js(v[1]) ", \"torch_ms\": " js(v[2]) ", \"time_ratio\": " js(v[3]) \
            ", \"trident_tflops\": " js(v[4]) ", \"torch_tflops\": " js(v[5]) ", \"tflops_ratio\": " js(v[6]) \
            ", \"trident_tokens_per_s\": " js(v[7]) ", \"torch_tokens_per_s\": " js(v[8]) \
            ", \"tokens_per_s_ratio\": " js(v[9]) ", \"trident_mfu\": " js(v[10]) ", \"torch_mfu\": " js(v[11]) \
            ", \"trident_record\": " (t == "" ? "null" : t) ", \"torch_record\": " (p == "" ? "null" : p) "}"
    }
    skipped = ""
    for (i = 1; i <= nskips; i++) {
        print "skipped: " skip_what[i] ": " skip_why[i]
        skipped = skipped (i > 1 ? ",\n    " : "    ") "{\"what\": " q(skip_what[i]) ", \"why\": " q(skip_why[i]) "}"
    }
    if (nskips == 0) print "nothing skipped"
    if (out != "") {
        printf "{\n  \"device\": %s,\n  \"device_kind\": %s,\n  \"peak_bf16_tflops\": %s,\n  \"trident_bin\": %s,\n", \
            (device == "" ? "null" : q(device)), (device_kind == "" ? "null" : q(device_kind)), js(peak), q(bin) > out
        printf "  \"torch\": %s,\n  \"columns\": %s,\n", torch_header, columns(header) > out
        printf "  \"rows\": [\n%s\n  ],\n  \"skipped\": [\n%s\n  ]\n}\n", rows, skipped > out
        close(out)
        print "gpu-bench: wrote " out
    }
}

function skip(what, why) {
    nskips++
    skip_what[nskips] = what
    skip_why[nskips] = why
}

# The value of "key" in the one-line JSON object `line`, as text: a number, or "" when the key is
# absent, null or not a number. Only the first occurrence counts (trident's records put the flat
# fields before the nested counters).
function num(line, key,    s) {
    if (line == "" || !match(line, "\"" key "\": *")) return ""
    s = substr(line, RSTART + RLENGTH)
    if (!match(s, /^-?[0-9][0-9.]*([eE][-+]?[0-9]+)?/)) return ""
    return substr(s, 1, RLENGTH)
}

# The string value of "key" in `line`, unescaped, or "" when absent.
function str(line, key,    s, r, ch, i) {
    if (line == "" || !match(line, "\"" key "\": *\"")) return ""
    s = substr(line, RSTART + RLENGTH)
    r = ""
    for (i = 1; i <= length(s); i++) {
        ch = substr(s, i, 1)
        if (ch == "\\") { i++; ch = substr(s, i, 1); if (ch == "n") ch = " "; r = r ch; continue }
        if (ch == "\"") break
        r = r ch
    }
    return r
}

# a / b, or "" when either is missing or b is not positive.
function ratio(a, b) {
    if (a == "" || b == "" || b + 0 <= 0) return ""
    return a / b
}

function cell(x) { return x == "" ? "-" : sprintf("%.4g", x) }

function js(x) { return x == "" ? "null" : sprintf("%.6g", x) }

# A JSON string of `s`: backslashes, quotes and control characters escaped.
function q(s) {
    gsub(/\\/, "\\\\", s)
    gsub(/"/, "\\\"", s)
    gsub(/\t/, " ", s)
    gsub(/\r/, " ", s)
    return "\"" s "\""
}

# The table's column names as a JSON array.
function columns(h,    n, parts, i, r) {
    n = split(h, parts, / +/)
    r = "["
    for (i = 1; i <= n; i++) r = r (i > 1 ? ", " : "") q(parts[i])
    return r "]"
}
