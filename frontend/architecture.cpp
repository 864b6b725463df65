// Validation of architecture records; field names in errors are the model file's (model.fbs).
#include "frontend/architecture.h"

#include <cmath>

#include "ir/attr.h"

namespace tpc {

Status validateGpt(const GptConfig& g, const TrainConfig& config, const ConfigFieldName& name) {
  struct Size {
    const char* field;
    int64_t value, max;
  };
  for (const Size& s : {Size{"arch.layers", g.layers, kMaxGptLayers}, Size{"arch.hidden", g.hidden, kMaxGptHidden},
                        Size{"arch.heads", g.heads, kMaxGptHeads}, Size{"arch.vocab", g.vocab, kMaxGptVocab},
                        Size{"arch.positions", g.positions, kMaxGptPositions}}) {
    if (s.value <= 0) return makeError(name(s.field), " must be > 0, got ", s.value);
    if (s.value > s.max) return makeError(name(s.field), "=", s.value, " is larger than the supported ", s.max);
  }
  if (g.paddedVocab < 0)
    return makeError(name("arch.padded_vocab"), " must be >= 0 (0: round vocab up to 128), got ", g.paddedVocab);
  if (g.paddedVocab != 0 && g.paddedVocab < g.vocab)
    return makeError(name("arch.padded_vocab"), "=", g.paddedVocab, " must be >= ", name("arch.vocab"), "=", g.vocab);
  if (g.paddedVocab > (int64_t(1) << 30)) return makeError(name("arch.padded_vocab"), "=", g.paddedVocab, " is too large");
  if (g.hidden % g.heads != 0)
    return makeError(name("arch.heads"), "=", g.heads, " must divide ", name("arch.hidden"), "=", g.hidden);
  for (auto [f, p] : {std::pair{"arch.hidden_dropout", g.hiddenDropout}, std::pair{"arch.attention_dropout", g.attentionDropout}})
    if (!(p >= 0 && p < 1)) return makeError(name(f), " must be in [0, 1), got ", formatFloat(p));
  if (!(g.layerNormEps > 0) || !std::isfinite(g.layerNormEps))
    return makeError(name("arch.layer_norm_eps"), " must be > 0, got ", formatFloat(g.layerNormEps));
  if (!(g.initStd >= 0) || !std::isfinite(g.initStd))
    return makeError(name("arch.init_std"), " must be >= 0, got ", formatFloat(g.initStd));
  if (config.seqLength > g.positions)
    return makeError(name("seq_length"), "=", config.seqLength, " is longer than the position table ",
                     name("arch.positions"), "=", g.positions);
  // The largest activation is the logits [micro, seq, padded vocab]; keep element counts below 2^50.
  double logits = double(config.microBatch) * double(config.seqLength) * double(std::max(g.resolvedPaddedVocab(), 4 * g.hidden));
  if (logits > std::ldexp(1.0, 50))
    return makeError(name("micro_batch_size"), " x ", name("seq_length"), " x ", name("arch.padded_vocab"), " is too large (",
                     logits, " elements)");
  if (double(g.hidden) * double(4 * g.hidden) > std::ldexp(1.0, 50))
    return makeError(name("arch.hidden"), "=", g.hidden, " is too large");
  return {};
}

}  // namespace tpc
