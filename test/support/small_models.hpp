// Small GPT-style models and A100 node shapes shared by the search tests.
#pragma once
#include "stratagem/cluster.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/model.hpp"

namespace stratagem::test {

inline ModelSpec small_model(int layers, int seq_len) {
  ModelSpec m;
  m.name = "test-gpt";
  m.layers = layers;
  m.hidden = 2048;
  m.heads = 16;
  m.kv_heads = 16;
  m.ffn_hidden = 8192;
  m.vocab = 32000;
  m.seq_len = seq_len;
  validate(m, "test");
  return m;
}

// dgx-a100-80g with a chosen node shape.
inline ClusterSpec cluster(int gpus_per_node, int nodes) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.node.gpus_per_node = gpus_per_node;
  c.nodes = nodes;
  return c;
}

}  // namespace stratagem::test
