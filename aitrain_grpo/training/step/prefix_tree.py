"""A pass's sequences as one prefix tree: every token that several rows share, with everything before it,
is one node computed once (step/shared_prefix.py runs the model over the tree).

Why a tree and not only the group's prompt: a group's episodes share their prompt, but under a context
strategy an episode's later sequences repeat its kept history (the prompt, the earlier turns, the
placeholders of dropped tool results), and episodes that open with the same words (`<tool_call>` and the
tool's name) share those too. A trie over the rows' real tokens finds all of it at once, whatever made
it: two rows share a node exactly when they agree on the token and on every token before it, which is
exactly when a causal model computes the same hidden state for both.

The packed layout (`PackedTree`), one row of real tokens, no padding:
- nodes in creation order, so a node's parent always comes before it; `positions` are a node's depth
  (its index in its sequence), the relative distances every row sees in the plain path (with left
  padding the plain path counts columns, padding included: a rotary model sees only the differences,
  so the values agree to float rounding). A model with absolute positions gets the plain path's column
  instead (`by_column`), and then rows share a node only at the same column;
- `visible[i, j]`: node i attends to node j, its ancestors and itself (the tree attention mask);
- `labels[i]`: the next token node i predicts for some row (-100: none). A node that predicts different
  next tokens for different rows (where their sequences part) gets a *copy* for each further label: the
  same token at the same position that sees the same ancestors (not the node: its key would count twice),
  so its hidden state is the node's, and nothing attends to it;
- `index[r, c]`: the packed position whose label is row r's token at completion column c (-1: that column
  is not scored, padding or past the row's end).

What is scored matches TRL's `_get_per_token_logps_and_entropies`: every completion column the attention
mask keeps (environment tokens too; the loss masks them), predicted from the token before it.

Left out: running the model (shared_prefix.py), deciding whether a tree pays (`cost_ratio` only
estimates it), and sharing across passes or steps (a node lives for one pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedTree:
    ids: torch.Tensor        # (nodes,) token ids, parents before children, copies last
    positions: torch.Tensor  # (nodes,) position ids
    visible: torch.Tensor    # (nodes, nodes) bool: row i attends to column j
    labels: torch.Tensor     # (nodes,) the label each node is scored on, -100 for none
    index: torch.Tensor      # (rows, completion columns) the node scoring each column, -1 for none
    row_tokens: int          # the real tokens of all rows (what the rows hold without padding)

    @property
    def nodes(self) -> int:
        return int(self.ids.numel())

    def attention_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as transformers takes a prepared 4D mask, (1, 1, nodes, nodes): 0 where a node
        attends, the dtype's lowest value where not (additive: eager and SDPA attention read it alike)."""
        bias = torch.zeros(self.visible.shape, dtype=dtype, device=self.visible.device)
        return bias.masked_fill_(~self.visible, torch.finfo(dtype).min)[None, None]


def build_tree(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *,
               by_column: bool = False) -> PackedTree:
    """The tree of `input_ids` rows (prompts left-padded, completions right-padded; `attention_mask` 1 on
    real tokens; the last `logits_to_keep` columns are the completion). `by_column`: positions are the
    plain path's columns and rows share only at equal columns (for models with absolute positions)."""
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    ids_list, mask_list = input_ids.tolist(), attention_mask.tolist()
    tokens: list[int] = []
    positions: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int, int], int] = {}
    label_of: list[int] = []
    slots: dict[tuple[int, int], int] = {}
    copies: list[tuple[int, int]] = []  # (node copied, label)
    paths: list[list[int]] = []
    scored: list[list[tuple[int, tuple[int, int]]]] = []  # per row: (completion column, (node, label))
    for r in range(rows):
        columns = [c for c in range(width) if mask_list[r][c]]
        node, path, wanted = -1, [], []
        for depth, c in enumerate(columns):
            token = ids_list[r][c]
            if depth and c >= prompt_width:
                wanted.append((c - prompt_width, (node, token)))
            position = c if by_column else depth
            key = (node, token, position)
            found = child.get(key)
            if found is None:
                found = len(tokens)
                child[key] = found
                tokens.append(token)
                positions.append(position)
                parents.append(node)
                label_of.append(-100)
            node = found
            path.append(node)
        paths.append(path)
        scored.append(wanted)
    # Each (node, label) gets a packed position: the node itself for its first label, a copy for others.
    for wanted in scored:
        for _, (node, label) in wanted:
            if (node, label) in slots:
                continue
            if label_of[node] == -100:
                label_of[node] = label
                slots[(node, label)] = node
            else:
                slots[(node, label)] = len(tokens) + len(copies)
                copies.append((node, label))
    total = len(tokens) + len(copies)
    device = input_ids.device
    visible = torch.zeros(total, total, dtype=torch.bool)
    for path in paths:
        if path:
            at = torch.tensor(path)
            visible[at[:, None], at[None, :]] = torch.ones(len(path), len(path), dtype=torch.bool).tril()
    for k, (node, label) in enumerate(copies):
        at = len(tokens) + k
        visible[at] = visible[node]
        visible[at, node] = False
        visible[at, at] = True
    index = torch.full((rows, logits_to_keep), -1, dtype=torch.long)
    for r, wanted in enumerate(scored):
        for column, slot in wanted:
            index[r, column] = slots[slot]
    copy_nodes = [node for node, _ in copies]
    return PackedTree(
        ids=torch.tensor(tokens + [tokens[n] for n in copy_nodes], dtype=input_ids.dtype, device=device),
        positions=torch.tensor(positions + [positions[n] for n in copy_nodes], dtype=torch.long, device=device),
        visible=visible.to(device),
        labels=torch.tensor(label_of + [label for _, label in copies], dtype=torch.long, device=device),
        index=index.to(device),
        row_tokens=int(attention_mask.sum()),
    )


def cost_ratio(tree: PackedTree, *, plain_tokens: int, plain_width: int, weights_per_token: int,
               attention_per_key: int) -> float:
    """The tree's forward cost over the plain path's, in multiply-adds: each position's weights
    (`weights_per_token`, the same in both) plus, for each key it is given, `attention_per_key` (the
    layers' query-key and value products). A dense mask computes masked pairs too, so a tree position
    is given every node; a plain row its padded width."""
    plain = plain_tokens * (weights_per_token + attention_per_key * plain_width)
    return tree.nodes * (weights_per_token + attention_per_key * tree.nodes) / max(plain, 1)


__all__ = ["PackedTree", "build_tree", "cost_ratio"]
