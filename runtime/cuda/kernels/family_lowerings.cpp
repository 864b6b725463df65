// The table from op kind to the kernel family that lowers it.
#include "runtime/cuda/kernels/family_lowerings.h"

namespace tpc::cuda {

const FamilyLowering* findFamilyLowering(OpKind op) {
  static const FamilyLowering attention = lowerAttention, attentionGrad = lowerAttentionGrad,
                              layerNorm = lowerLayerNorm, layerNormGrad = lowerLayerNormGrad,
                              softmax = lowerSoftmax, softmaxGrad = lowerSoftmaxGrad,
                              crossEntropy = lowerCrossEntropy, crossEntropyGrad = lowerCrossEntropyGrad,
                              crossEntropyWithGrad = lowerCrossEntropyWithGrad,
                              vocabMax = lowerVocabMax, vocabSumExp = lowerVocabSumExp, vocabPick = lowerVocabPick,
                              vocabLoss = lowerVocabLoss, vocabXentGrad = lowerVocabXentGrad,
                              embedding = lowerEmbedding, embeddingGrad = lowerEmbeddingGrad, reduce = lowerReduce,
                              sumSquares = lowerSumSquares, adamw = lowerAdamWUpdate, clipScale = lowerClipScale;
  switch (op) {
    case OpKind::Attention: return &attention;
    case OpKind::AttentionGrad: return &attentionGrad;
    case OpKind::AttentionQkv: return &attention;
    case OpKind::AttentionQkvGrad: return &attentionGrad;
    case OpKind::LayerNorm: return &layerNorm;
    case OpKind::LayerNormGrad: return &layerNormGrad;
    case OpKind::Softmax: return &softmax;
    case OpKind::SoftmaxGrad: return &softmaxGrad;
    case OpKind::CrossEntropy: return &crossEntropy;
    case OpKind::CrossEntropyGrad: return &crossEntropyGrad;
    case OpKind::CrossEntropyWithGrad: return &crossEntropyWithGrad;
    case OpKind::VocabMax: return &vocabMax;
    case OpKind::VocabSumExp: return &vocabSumExp;
    case OpKind::VocabPick: return &vocabPick;
    case OpKind::VocabLoss: return &vocabLoss;
    case OpKind::VocabXentGrad: return &vocabXentGrad;
    case OpKind::Embedding: return &embedding;
    case OpKind::EmbeddingGrad: return &embeddingGrad;
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceMax: return &reduce;
    case OpKind::SumSquares:
    case OpKind::GlobalNorm: return &sumSquares;
    case OpKind::AdamWUpdate: return &adamw;
    case OpKind::ClipScale: return &clipScale;
    default: return nullptr;
  }
}

}  // namespace tpc::cuda
