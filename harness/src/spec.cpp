#include "flashbench/spec.hpp"

#include "flashbench/dispatch.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/traffic.hpp"
#include "flashbench/tuner.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace fb {

namespace {

// Every message starts with file:line:col (1-based) of the node it is about.
struct Ctx {
  std::string path;
  // Where nodes that come from no line of the file (a preset's fields) point: the `preset:` entry.
  YAML::Mark fallback = YAML::Mark::null_mark();
  YAML::Mark mark_of(const YAML::Node &n) const { return n.Mark().line >= 0 ? n.Mark() : fallback; }
  [[noreturn]] void fail(const YAML::Node &n, const std::string &what) const {
    std::ostringstream os;
    os << path;
    const YAML::Mark m = mark_of(n);
    if (m.line >= 0)
      os << ":" << m.line + 1 << ":" << m.column + 1;
    os << ": " << what;
    throw UserError(os.str());
  }
  std::string where(const YAML::Node &n) const {
    const YAML::Mark m = mark_of(n);
    return path + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  }
};

int64_t as_int(const Ctx &c, const YAML::Node &n, const std::string &field) {
  if (!n.IsScalar())
    c.fail(n, field + " must be an integer");
  try {
    size_t used = 0;
    const std::string s = n.Scalar();
    const long long v = std::stoll(s, &used);
    if (used != s.size())
      throw std::invalid_argument(s);
    return v;
  } catch (const std::exception &) {
    c.fail(n, field + " must be an integer, got '" + n.Scalar() + "'");
  }
}

double as_double(const Ctx &c, const YAML::Node &n, const std::string &field) {
  if (!n.IsScalar())
    c.fail(n, field + " must be a number");
  try {
    size_t used = 0;
    const double v = std::stod(n.Scalar(), &used);
    if (used != n.Scalar().size())
      throw std::invalid_argument(n.Scalar());
    return v;
  } catch (const std::exception &) {
    c.fail(n, field + " must be a number, got '" + n.Scalar() + "'");
  }
}

bool as_bool(const Ctx &c, const YAML::Node &n, const std::string &field) {
  if (n.IsScalar()) {
    const std::string s = n.Scalar();
    if (s == "true" || s == "True" || s == "yes" || s == "on")
      return true;
    if (s == "false" || s == "False" || s == "no" || s == "off")
      return false;
  }
  c.fail(n, field + " must be true or false");
}

// A problem field's values: a scalar, a list, {range: [from, to, step]} (inclusive) or {pow2: [lo, hi]}.
std::vector<YAML::Node> axis_values(const Ctx &c, const YAML::Node &n, const std::string &field,
                                    bool numeric) {
  std::vector<YAML::Node> out;
  if (n.IsScalar()) {
    out.push_back(n);
  } else if (n.IsSequence()) {
    for (const auto &e : n) {
      if (!e.IsScalar())
        c.fail(e, field + ": list entries must be plain values");
      out.push_back(e);
    }
  } else if (n.IsMap() && n.size() == 1 && numeric && (n["range"] || n["pow2"])) {
    const bool pow2 = bool(n["pow2"]);
    const YAML::Node r = pow2 ? n["pow2"] : n["range"];
    if (!r.IsSequence() || r.size() < 2 || r.size() > (pow2 ? 2u : 3u))
      c.fail(r, field + (pow2 ? ": pow2 takes [lo, hi]"
                              : ": range takes [from, to] or [from, to, step]"));
    const int64_t lo = as_int(c, r[0], field), hi = as_int(c, r[1], field);
    const int64_t step = r.size() == 3 ? as_int(c, r[2], field) : 1;
    if (lo > hi || step < 1 || (pow2 && lo < 1))
      c.fail(r, field + ": empty or invalid range (need 1 <= lo <= hi and step >= 1)");
    for (int64_t v = lo; v <= hi; v = pow2 ? v * 2 : v + step) {
      YAML::Node e(std::to_string(v));
      out.push_back(e);
      if (out.size() > 100000)
        c.fail(r, field + ": range expands to over 100000 values");
    }
  } else {
    c.fail(n, field + " must be a value, a list, {range: [from, to, step]} or {pow2: [lo, hi]}");
  }
  if (out.empty())
    c.fail(n, field + " is an empty axis; give at least one value");
  return out;
}

const std::vector<std::string> kProblemFields = {
    "name",        "batch",   "heads_q",   "heads_kv", "heads",  "gqa",   "seqlen_q", "seqlen_kv",
    "seqlen",      "tokens",  "hidden",    "head_dim", "causal", "dtype", "layout",   "scale",
    "constraints", "kv_lens", "page_size", "preset",   "pass",   "quant"};

std::string known_list(const std::vector<std::string> &v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + v[i];
  return s;
}

// A constraint "lhs op rhs" over problem fields and integers, e.g. "seqlen_kv >= seqlen_q".
struct Constraint {
  std::string lhs, op, rhs, text;
  YAML::Node node;
};

int64_t field_value(const AttentionProblem &p, const std::string &f, bool *ok) {
  *ok = true;
  if (f == "batch")
    return p.batch;
  if (f == "heads_q")
    return p.heads_q;
  if (f == "heads_kv")
    return p.heads_kv;
  if (f == "seqlen_q")
    return p.seqlen_q;
  if (f == "seqlen_kv")
    return p.seqlen_kv;
  if (f == "head_dim")
    return p.head_dim;
  if (f == "page_size")
    return p.page_size;
  try {
    size_t used = 0;
    const long long v = std::stoll(f, &used);
    if (used == f.size())
      return v;
  } catch (const std::exception &) {
  }
  *ok = false;
  return 0;
}

Constraint parse_constraint(const Ctx &c, const YAML::Node &n) {
  if (!n.IsScalar())
    c.fail(n, "a constraint is a string like 'seqlen_kv >= seqlen_q'");
  std::istringstream is(n.Scalar());
  Constraint k;
  k.text = n.Scalar();
  k.node = n;
  is >> k.lhs >> k.op >> k.rhs;
  std::string extra;
  is >> extra;
  static const std::set<std::string> ops = {"<", "<=", ">", ">=", "==", "!="};
  bool ok1 = false, ok2 = false;
  AttentionProblem probe;
  field_value(probe, k.lhs, &ok1);
  field_value(probe, k.rhs, &ok2);
  if (!ops.count(k.op) || !ok1 || !ok2 || !extra.empty())
    c.fail(
        n,
        "cannot read constraint '" + k.text +
            "'; write 'FIELD OP FIELD_OR_INTEGER' with OP one of < <= > >= == != and FIELD one of "
            "batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim, page_size");
  return k;
}

bool holds(const Constraint &k, const AttentionProblem &p) {
  bool ok;
  const int64_t a = field_value(p, k.lhs, &ok), b = field_value(p, k.rhs, &ok);
  if (k.op == "<")
    return a < b;
  if (k.op == "<=")
    return a <= b;
  if (k.op == ">")
    return a > b;
  if (k.op == ">=")
    return a >= b;
  if (k.op == "==")
    return a == b;
  return a != b;
}

// kv_lens is one value per problem, not an axis: a list of lengths (one per batch entry; it sets batch),
// `random` (seed 0) or {random: SEED}: lengths drawn uniformly from [1, seqlen_kv] by random_kv_lens(seed).
struct KvLensSpec {
  enum class Kind { none, list, random } kind = Kind::none;
  std::vector<int64_t> lens;
  uint64_t seed = 0;
  YAML::Node node;
};

KvLensSpec parse_kv_lens(const Ctx &c, const YAML::Node &n) {
  KvLensSpec k;
  k.node = n;
  const char *how =
      "kv_lens must be a list of per-entry lengths ([1, 257, 8191]), 'random' or {random: SEED}";
  if (n.IsSequence()) {
    k.kind = KvLensSpec::Kind::list;
    for (const auto &e : n) {
      const int64_t v = as_int(c, e, "kv_lens");
      if (v < 0)
        c.fail(e, "kv_lens entries must be >= 0 (0 = an entry with an empty cache)");
      k.lens.push_back(v);
    }
    if (k.lens.empty())
      c.fail(n, how);
  } else if (n.IsScalar() && n.Scalar() == "random") {
    k.kind = KvLensSpec::Kind::random;
  } else if (n.IsMap() && n.size() == 1 && n["random"]) {
    k.kind = KvLensSpec::Kind::random;
    const int64_t seed = as_int(c, n["random"], "kv_lens random seed");
    if (seed < 0)
      c.fail(n["random"], "the kv_lens random seed must be >= 0");
    k.seed = static_cast<uint64_t>(seed);
  } else {
    c.fail(n, how);
  }
  return k;
}

// Named shapes of real models: the whole model's attention (all heads on one GPU), bf16. Fields given beside
// `preset:` replace the preset's fields that set the same thing (replaced_by), so
// `{preset: llama3-8b-prefill, seqlen: 4096}` keeps the heads and takes one length. Decode is one new token per
// sequence over a KV cache; with bottom-right alignment causal and not are the same mask there, so it is false.
struct Preset {
  const char *name;
  std::vector<std::pair<std::string, std::vector<std::string>>> fields;
};
const std::vector<Preset> &presets() {
  static const std::vector<Preset> p = [] {
    auto prefill = [](const char *name, const char *heads_q, const char *gqa) {
      return Preset{name,
                    {{"heads_q", {heads_q}},
                     {"gqa", {gqa}},
                     {"head_dim", {"128"}},
                     {"causal", {"true"}},
                     {"dtype", {"bf16"}},
                     {"tokens", {"16384"}},
                     {"seqlen", {"1024", "2048", "4096", "8192"}}}};
    };
    auto decode = [](const char *name, const char *heads_q, const char *gqa) {
      return Preset{name,
                    {{"heads_q", {heads_q}},
                     {"gqa", {gqa}},
                     {"head_dim", {"128"}},
                     {"causal", {"false"}},
                     {"dtype", {"bf16"}},
                     {"batch", {"1", "16", "64"}},
                     {"seqlen_q", {"1"}},
                     {"seqlen_kv", {"1024", "4096", "16384", "65536"}}}};
    };
    // Llama-3-8B: 32 query heads, 8 KV heads (GQA 4); Llama-3-70B: 64 query heads, 8 KV heads (GQA 8); d = 128.
    return std::vector<Preset>{
        prefill("llama3-8b-prefill", "32", "4"), prefill("llama3-70b-prefill", "64", "8"),
        decode("llama3-8b-decode", "32", "4"), decode("llama3-70b-decode", "64", "8")};
  }();
  return p;
}

// The preset fields a user's field replaces: the ones that set the same thing, so that e.g. seqlen_kv alone keeps a
// decode preset's seqlen_q = 1, and heads_q keeps its GQA ratio.
std::set<std::string> replaced_by(const std::string &f) {
  if (f == "seqlen")
    return {"seqlen", "seqlen_q", "seqlen_kv"};
  if (f == "seqlen_q")
    return {"seqlen", "seqlen_q"};
  if (f == "seqlen_kv")
    return {"seqlen", "seqlen_kv"};
  if (f == "heads")
    return {"heads", "heads_q", "heads_kv", "hidden", "gqa"};
  if (f == "heads_q" || f == "hidden")
    return {"heads", "heads_q", "hidden"};
  if (f == "heads_kv" || f == "gqa")
    return {"heads", "heads_kv", "gqa"};
  if (f == "batch" || f == "tokens" || f == "kv_lens")
    return {"batch", "tokens"};
  return {f};
}

void expand_problem_entry(const Ctx &c, const YAML::Node &entry,
                          std::vector<AttentionProblem> &out);

// An entry with `preset:` becomes the preset's fields plus the entry's own; errors about preset fields point at
// the `preset:` line.
void expand_preset_entry(const Ctx &c, const YAML::Node &entry,
                         std::vector<AttentionProblem> &out) {
  const YAML::Node name = entry["preset"];
  std::string known;
  for (const auto &p : presets())
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  if (!name.IsScalar())
    c.fail(name, "preset must be a name; known presets: " + known);
  const auto it = std::find_if(presets().begin(), presets().end(),
                               [&](const Preset &p) { return name.Scalar() == p.name; });
  if (it == presets().end())
    c.fail(name, "unknown preset '" + name.Scalar() + "'; known presets: " + known);
  YAML::Node merged(YAML::NodeType::Map);
  std::set<std::string> replaced;
  for (const auto &kv : entry) {
    const std::string f = kv.first.as<std::string>();
    if (f == "preset")
      continue;
    for (const auto &r : replaced_by(f))
      replaced.insert(r);
    merged[kv.first] = kv.second;
  }
  for (const auto &[field, values] : it->fields) {
    if (replaced.count(field))
      continue;
    YAML::Node v;
    if (values.size() == 1) {
      v = YAML::Node(values.front());
    } else {
      v = YAML::Node(YAML::NodeType::Sequence);
      for (const auto &x : values)
        v.push_back(YAML::Node(x));
    }
    merged[field] = v;
  }
  Ctx pc = c;
  pc.fallback = name.Mark();
  expand_problem_entry(pc, merged, out);
}

void expand_problem_entry(const Ctx &c, const YAML::Node &entry,
                          std::vector<AttentionProblem> &out) {
  if (!entry.IsMap())
    c.fail(entry, "each entry of 'problems' must be a map of fields");
  if (entry["preset"])
    return expand_preset_entry(c, entry, out);
  KvLensSpec kv_lens;
  std::vector<std::pair<std::string, std::vector<YAML::Node>>> axes;
  std::vector<Constraint> constraints;
  std::set<std::string> given;
  for (const auto &kv : entry) {
    const std::string f = kv.first.as<std::string>();
    if (std::find(kProblemFields.begin(), kProblemFields.end(), f) == kProblemFields.end())
      c.fail(kv.first,
             "unknown problem field '" + f + "'; known fields: " + known_list(kProblemFields));
    given.insert(f);
    if (f == "name")
      continue;
    if (f == "kv_lens") {
      kv_lens = parse_kv_lens(c, kv.second);
      continue;
    }
    if (f == "constraints") {
      if (!kv.second.IsSequence())
        c.fail(kv.second, "constraints must be a list of strings");
      for (const auto &k : kv.second)
        constraints.push_back(parse_constraint(c, k));
      continue;
    }
    const bool numeric =
        !(f == "causal" || f == "dtype" || f == "layout" || f == "pass" || f == "quant");
    axes.emplace_back(f, axis_values(c, kv.second, f, numeric));
  }
  auto clash = [&](const std::string &a, const std::string &b) {
    if (given.count(a) && given.count(b))
      c.fail(entry[a], "give '" + a + "' or '" + b + "', not both (" + a + " sets " + b + ")");
  };
  clash("seqlen", "seqlen_q");
  clash("seqlen", "seqlen_kv");
  clash("heads", "heads_q");
  clash("heads", "heads_kv");
  clash("hidden", "heads_q");
  clash("hidden", "heads");
  clash("tokens", "batch");
  clash("gqa", "heads_kv");
  if (kv_lens.kind == KvLensSpec::Kind::list)
    clash("kv_lens", "tokens");
  if (!given.count("head_dim"))
    c.fail(entry, "problem entry has no head_dim; add e.g. 'head_dim: 128'");
  if (!given.count("seqlen") && !(given.count("seqlen_q") && given.count("seqlen_kv")))
    c.fail(entry, "problem entry needs 'seqlen' or both 'seqlen_q' and 'seqlen_kv'");
  if (!given.count("heads") && !given.count("heads_q") && !given.count("hidden"))
    c.fail(entry, "problem entry needs 'heads', 'heads_q' or 'hidden'");

  size_t total = 1;
  for (const auto &a : axes)
    total *= a.second.size();
  if (total > 1000000)
    c.fail(entry, "problem entry expands to " + std::to_string(total) + " problems; narrow it");
  const size_t before = out.size();
  std::vector<size_t> idx(axes.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    AttentionProblem p;
    std::optional<int64_t> seqlen, heads, gqa, tokens, hidden;
    const YAML::Node *derived_node = &entry;
    for (size_t a = 0; a < axes.size(); ++a) {
      const std::string &f = axes[a].first;
      const YAML::Node &v = axes[a].second[idx[a]];
      if (f == "batch")
        p.batch = as_int(c, v, f);
      else if (f == "heads_q")
        p.heads_q = as_int(c, v, f);
      else if (f == "heads_kv")
        p.heads_kv = as_int(c, v, f);
      else if (f == "heads")
        heads = as_int(c, v, f);
      else if (f == "gqa")
        gqa = as_int(c, v, f);
      else if (f == "seqlen_q")
        p.seqlen_q = as_int(c, v, f);
      else if (f == "seqlen_kv")
        p.seqlen_kv = as_int(c, v, f);
      else if (f == "seqlen")
        seqlen = as_int(c, v, f);
      else if (f == "tokens")
        tokens = as_int(c, v, f);
      else if (f == "hidden")
        hidden = as_int(c, v, f);
      else if (f == "head_dim")
        p.head_dim = as_int(c, v, f);
      else if (f == "causal")
        p.causal = as_bool(c, v, f);
      else if (f == "scale")
        p.scale = as_double(c, v, f);
      else if (f == "page_size")
        p.page_size = as_int(c, v, f);
      else if (f == "dtype" || f == "layout" || f == "pass" || f == "quant") {
        try {
          if (f == "dtype")
            p.dtype = parse_dtype(v.Scalar());
          else if (f == "layout")
            p.layout = parse_layout(v.Scalar());
          else if (f == "pass")
            p.pass = parse_pass(v.Scalar());
          else
            p.quant = parse_quant(v.Scalar());
        } catch (const UserError &e) {
          c.fail(v, e.what());
        }
      }
    }
    if (seqlen)
      p.seqlen_q = p.seqlen_kv = *seqlen;
    if (heads)
      p.heads_q = p.heads_kv = *heads;
    if (hidden) {
      if (p.head_dim < 1 || *hidden < 1 || *hidden % p.head_dim != 0)
        c.fail(entry["hidden"],
               "hidden = " + std::to_string(*hidden) +
                   " is not a positive multiple of head_dim = " + std::to_string(p.head_dim));
      p.heads_q = *hidden / p.head_dim;
      if (!given.count("heads_kv"))
        p.heads_kv = p.heads_q;
    }
    if (!given.count("heads_kv") && !heads && !hidden)
      p.heads_kv = p.heads_q;
    if (gqa) {
      if (*gqa < 1 || p.heads_q % *gqa != 0)
        c.fail(entry["gqa"], "gqa = " + std::to_string(*gqa) +
                                 " must divide heads_q = " + std::to_string(p.heads_q));
      p.heads_kv = p.heads_q / *gqa;
    }
    if (tokens) {
      if (p.seqlen_q < 1 || *tokens < 1 || *tokens % p.seqlen_q != 0)
        c.fail(entry["tokens"],
               "tokens = " + std::to_string(*tokens) +
                   " is not a positive multiple of seqlen_q = " + std::to_string(p.seqlen_q));
      p.batch = *tokens / p.seqlen_q;
    }
    if (kv_lens.kind == KvLensSpec::Kind::list) {
      if (given.count("batch") && p.batch != static_cast<int64_t>(kv_lens.lens.size()))
        c.fail(kv_lens.node, "kv_lens has " + std::to_string(kv_lens.lens.size()) +
                                 " entries but batch = " + std::to_string(p.batch) +
                                 "; drop 'batch' (kv_lens sets it) or match it");
      p.batch = static_cast<int64_t>(kv_lens.lens.size());
      p.kv_lens = kv_lens.lens;
    } else if (kv_lens.kind == KvLensSpec::Kind::random) {
      p.kv_lens = random_kv_lens(p.batch, p.seqlen_kv, kv_lens.seed);
    }
    try {
      validate(p);
    } catch (const UserError &e) {
      c.fail(*derived_node, std::string("impossible problem ") + key(p) + ": " + e.what());
    }
    bool keep = true;
    for (const auto &k : constraints)
      keep = keep && holds(k, p);
    if (keep && std::find(out.begin(), out.end(), p) == out.end())
      out.push_back(p);
    for (size_t a = axes.size(); a-- > 0;) {
      if (++idx[a] < axes[a].second.size())
        break;
      idx[a] = 0;
    }
  }
  if (out.size() == before && !constraints.empty())
    c.fail(constraints.front().node,
           "the constraints exclude every problem of this entry (contradictory?)");
}

void parse_timing(const Ctx &c, const YAML::Node &n, TimingPolicy &t) {
  if (!n.IsMap())
    c.fail(n, "timing must be a map (min_samples, max_noise, min_time_s, timeout_s, ...)");
  static const std::vector<std::string> known = {
      "min_samples", "max_noise",         "min_time_s",      "timeout_s", "max_samples", "cold",
      "warmup_runs", "throttle_fraction", "point_timeout_s", "flush",     "settle_s",    "queue"};
  for (const auto &kv : n) {
    const std::string f = kv.first.as<std::string>();
    const YAML::Node &v = kv.second;
    if (f == "min_samples")
      t.min_samples = static_cast<int>(as_int(c, v, f));
    else if (f == "max_noise")
      t.max_noise = as_double(c, v, f);
    else if (f == "min_time_s")
      t.min_time_s = as_double(c, v, f);
    else if (f == "timeout_s")
      t.timeout_s = as_double(c, v, f);
    else if (f == "max_samples")
      t.max_samples = static_cast<int>(as_int(c, v, f));
    else if (f == "cold")
      t.cold = as_bool(c, v, f);
    else if (f == "flush") {
      t.flush = v.as<std::string>();
      if (t.flush != "read" && t.flush != "write")
        c.fail(v, "timing.flush must be 'read' (leave the L2 full of clean lines) or 'write' "
                  "(memset, as nvbench)");
    } else if (f == "warmup_runs")
      t.warmup_runs = static_cast<int>(as_int(c, v, f));
    else if (f == "throttle_fraction")
      t.throttle_fraction = as_double(c, v, f);
    else if (f == "point_timeout_s")
      t.point_timeout_s = as_double(c, v, f);
    else if (f == "settle_s")
      t.settle_s = as_double(c, v, f);
    else if (f == "queue") {
      t.queue = v.as<std::string>();
      if (t.queue != "round_trip" && t.queue != "back_to_back")
        c.fail(v, "timing.queue must be 'round_trip' (one sample per host round trip) or "
                  "'back_to_back' (batches "
                  "queued behind the running one, as do_bench)");
    } else
      c.fail(kv.first, "unknown timing field '" + f + "'; known: " + known_list(known));
  }
  if (t.min_samples < 1 || t.max_samples < t.min_samples || t.max_noise <= 0 || t.min_time_s < 0 ||
      t.timeout_s <= 0 || t.warmup_runs < 0 || t.throttle_fraction < 0 || t.throttle_fraction > 1)
    c.fail(n, "timing values out of range (need min_samples >= 1, max_samples >= min_samples, "
              "max_noise > 0, "
              "timeout_s > 0, 0 <= throttle_fraction <= 1)");
  if (t.point_timeout_s <= t.timeout_s)
    c.fail(n, "timing.point_timeout_s (" + std::to_string(t.point_timeout_s) +
                  " s) must exceed timeout_s (" + std::to_string(t.timeout_s) +
                  " s): the point deadline covers sampling plus verification");
}

VariantSelection parse_selection(const Ctx &c, const std::string &name, const YAML::Node &key,
                                 const YAML::Node &v) {
  VariantSelection s;
  s.variant = name;
  s.where = c.where(key);
  YAML::Node configs = v;
  if (v.IsMap()) {
    for (const auto &kv : v) {
      const std::string f = kv.first.as<std::string>();
      if (f != "configs" && f != "problems")
        c.fail(kv.first, "unknown field '" + f + "' for variant " + name +
                             "; known: configs (all | default | tuned | a list of configs), "
                             "problems (entry names)");
    }
    if (const YAML::Node only = v["problems"]) {
      if (only.IsScalar())
        s.problems.push_back(only.Scalar());
      else if (only.IsSequence() && only.size() > 0)
        for (const auto &e : only) {
          if (!e.IsScalar())
            c.fail(e, "problems: a list of problem entry names");
          s.problems.push_back(e.Scalar());
        }
      else
        c.fail(only, "problems: a problem entry name or a non-empty list of them");
    }
    if (!v["configs"] && s.problems.empty())
      c.fail(v, "variant " + name + ": add 'configs: all | default | [ {param: value}, ... ]'");
    configs.reset(v["configs"] ? v["configs"]
                               : YAML::Node()); // rebind: '=' would write into v's node
  }
  if (!configs || configs.IsNull()) {
    s.mode = VariantSelection::Mode::default_config;
  } else if (configs.IsScalar()) {
    if (configs.Scalar() == "all")
      s.mode = VariantSelection::Mode::all;
    else if (configs.Scalar() == "default")
      s.mode = VariantSelection::Mode::default_config;
    else if (configs.Scalar() == "tuned")
      s.mode = VariantSelection::Mode::tuned;
    else
      c.fail(configs, "configs must be 'all', 'default', 'tuned' or a list of {param: value} maps");
  } else if (configs.IsSequence()) {
    s.mode = VariantSelection::Mode::list;
    if (configs.size() == 0)
      c.fail(configs, "empty config list for " + name + "; use 'default' or list configs");
    for (const auto &e : configs) {
      if (!e.IsMap())
        c.fail(e, "each config is a map like {block_m: 64, block_n: 64}");
      std::map<std::string, std::string> m;
      for (const auto &kv : e) {
        if (!kv.second.IsScalar())
          c.fail(kv.second, "config values are plain values");
        m[kv.first.as<std::string>()] = kv.second.Scalar();
      }
      s.configs.push_back(m);
    }
  } else {
    c.fail(configs, "configs must be 'all', 'default', 'tuned' or a list of {param: value} maps");
  }
  return s;
}

} // namespace

SweepSpec parse_spec(const std::string &text, const std::string &path) {
  Ctx c{path};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException &e) {
    std::ostringstream os;
    os << path << ":" << e.mark.line + 1 << ":" << e.mark.column + 1
       << ": malformed YAML: " << e.msg << "; fix the syntax there";
    throw UserError(os.str());
  }
  if (!root.IsMap())
    throw UserError(path + ": a sweep spec is a YAML map with 'problems' and 'variants'");
  SweepSpec s;
  s.path = path;
  static const std::vector<std::string> known = {"name", "description", "timing", "problems",
                                                 "variants"};
  for (const auto &kv : root) {
    const std::string f = kv.first.as<std::string>();
    if (std::find(known.begin(), known.end(), f) == known.end())
      c.fail(kv.first, "unknown top-level field '" + f + "'; known: " + known_list(known));
  }
  s.name = root["name"] ? root["name"].as<std::string>() : path;
  if (root["timing"])
    parse_timing(c, root["timing"], s.timing);
  const YAML::Node problems = root["problems"];
  if (!problems || !problems.IsSequence() || problems.size() == 0)
    throw UserError(path + ": 'problems' must be a non-empty list of problem entries");
  std::set<std::string> entry_names;
  for (const auto &e : problems) {
    // Each entry's problems carry the entry's name (its 'name', else its preset's), so that a variant can be
    // limited to some entries ('problems: [decode]'); a problem two entries produce is kept once, with both names.
    std::vector<AttentionProblem> expanded;
    expand_problem_entry(c, e, expanded);
    std::string entry_name;
    if (e.IsMap() && e["name"] && e["name"].IsScalar())
      entry_name = e["name"].Scalar();
    else if (e.IsMap() && e["preset"] && e["preset"].IsScalar())
      entry_name = e["preset"].Scalar();
    if (!entry_name.empty())
      entry_names.insert(entry_name);
    for (auto &p : expanded) {
      const auto it = std::find(s.problems.begin(), s.problems.end(), p);
      const size_t i = static_cast<size_t>(it - s.problems.begin());
      if (it == s.problems.end()) {
        s.problems.push_back(std::move(p));
        s.problem_entries.emplace_back();
      }
      if (!entry_name.empty())
        s.problem_entries[i].insert(entry_name);
    }
  }
  const YAML::Node variants = root["variants"];
  if (!variants || variants.size() == 0)
    throw UserError(path + ": 'variants' must name at least one variant (see 'flashbench list')");
  if (variants.IsSequence()) {
    for (const auto &e : variants) {
      if (!e.IsScalar())
        c.fail(e, "a variants list holds names; use a map for configs");
      s.variants.push_back(parse_selection(c, e.Scalar(), e, YAML::Node()));
    }
  } else if (variants.IsMap()) {
    for (const auto &kv : variants)
      s.variants.push_back(parse_selection(c, kv.first.as<std::string>(), kv.first, kv.second));
  } else {
    c.fail(variants, "'variants' must be a list of names or a map name -> configs");
  }
  for (const auto &sel : s.variants)
    for (const auto &want : sel.problems)
      if (!entry_names.count(want))
        throw UserError(sel.where + ": variant " + sel.variant + " names problem entry '" + want +
                        "', which no entry of 'problems' has; give that entry 'name: " + want +
                        "' or fix the name");
  return s;
}

SweepSpec load_spec(const std::string &path) {
  std::ifstream is(path);
  if (!is)
    throw UserError(path + ": cannot open sweep spec; check the path (specs live in sweeps/)");
  std::stringstream ss;
  ss << is.rdbuf();
  return parse_spec(ss.str(), path);
}

void check_config_maps(const VariantSelection &sel, const Variant &v) {
  for (const auto &m : sel.configs) {
    try {
      (void)v.space().make(m);
    } catch (const UserError &e) {
      throw UserError(sel.where + ": " + sel.variant + ": " + e.what());
    }
  }
}

std::vector<PlannedPoint> plan(const SweepSpec &spec, const Registry &registry,
                               const DeviceInfo &dev) {
  std::vector<PlannedPoint> out;
  for (const auto &sel : spec.variants) {
    const Variant *v = registry.find(sel.variant);
    if (!v) {
      try {
        registry.get(sel.variant);
      } catch (const UserError &e) {
        throw UserError(sel.where + ": " + e.what());
      }
    }
    std::vector<std::pair<Config, std::optional<std::string>>> configs;
    switch (sel.mode) {
    case VariantSelection::Mode::all:
      for (auto &e : v->space().expand())
        configs.emplace_back(e.config, e.invalid_reason);
      break;
    case VariantSelection::Mode::default_config: // per problem, below
    case VariantSelection::Mode::tuned:
      break;
    case VariantSelection::Mode::list:
      // Each problem completes the maps below (complete_config: the axes a map leaves out from the problem's
      // default), as the C API does.
      check_config_maps(sel, *v);
      break;
    }
    for (size_t pi = 0; pi < spec.problems.size(); ++pi) {
      const AttentionProblem &p = spec.problems[pi];
      if (!sel.problems.empty() && pi < spec.problem_entries.size() &&
          std::none_of(sel.problems.begin(), sel.problems.end(),
                       [&](const std::string &n) { return spec.problem_entries[pi].count(n) > 0; }))
        continue; // the spec runs this variant on its named entries only
      std::string source;
      if (sel.mode == VariantSelection::Mode::tuned) {
        auto [cfg, why] = tuned_config(*v, p, dev);
        configs.assign(1, {cfg, std::nullopt});
        source = why;
      } else if (sel.mode == VariantSelection::Mode::default_config) {
        configs.assign(1, {v->space().default_config(p, dev),
                           std::nullopt}); // depends on head_dim, dtype, ...
      } else if (sel.mode == VariantSelection::Mode::list) {
        configs.clear();
        for (const auto &m : sel.configs) {
          Config cfg = complete_config(*v, m, p, dev);
          std::optional<std::string> invalid = v->space().check(cfg);
          configs.emplace_back(std::move(cfg), std::move(invalid));
        }
      }
      for (const auto &[cfg, invalid] : configs) {
        const TrafficModel traffic = traffic_model(*v, p, cfg, dev);
        PlannedPoint pt{v, cfg, p, invalid, {}, traffic.bytes};
        pt.model_reason = traffic.reason;
        if (traffic.has_range())
          pt.model_low = traffic.low, pt.model_high = traffic.high;
        pt.config_source = source;
        if (!pt.skip_reason) {
          Support sup = support_for(*v, p, cfg, dev);
          if (!sup.ok)
            pt.skip_reason = sup.reason;
        }
        const bool dup = std::any_of(out.begin(), out.end(), [&](const PlannedPoint &o) {
          return o.variant == v && o.config == cfg && o.problem == p;
        });
        if (!dup)
          out.push_back(std::move(pt));
      }
    }
  }
  return out;
}

} // namespace fb
