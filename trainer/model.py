"""The DLRM: bottom MLP, embedding tables, dot or DCNv2 interaction, top MLP — one rank's share.

Every variable is initialised from a stateless random seed derived from its identity (the global
seed and the layer, or the table and column), so a table has the same initial values whichever
rank holds it, and a column slice of a table equals the same columns of the whole table. That
is what makes one process and N ranks train the same model.

Forward pass on rank r with global batch B and N ranks (local batch b = B / N):
1. look up the owned table pieces for all B samples (+ the bottom MLP over all B numericals if
   this rank owns a model-parallel bottom MLP) -> [B, W_r];
2. alltoall: samples j*b..(j+1)*b go to rank j; each rank receives [b, sum W_s] and reorders
   the columns to [bottom?] C1..C26 (``Placement.feature_columns``);
3. the dense part on the local b samples: bottom MLP (if data parallel), interaction (dot, or
   DCNv2's cross layers), top MLP -> one logit. It is a separate function so that ``--xla`` can compile it (Horovod ops
   cannot sit inside an XLA cluster).
The alltoall's registered gradient sends embedding gradients back to the owners.

A multi-hot column (several ids per row, [B, k]) is pooled by sum on the rank that owns its
table, before the exchange: the alltoall moves one vector per (row, table) whatever k, and the
gather's gradient reaches each of the k rows (duplicates summed by the optimizer).

With ``dims.wide`` each table also has one scalar weight per id (the first-order term a
logistic regression has and the dot interaction lacks), held by the rank holding the table's
column 0. The owner sums its tables' weights per sample and sends that partial sum as one more
column of its exchange; the receiver adds the partial sums of all ranks to the logit. A
column-split table's weights are thus looked up once, and the exchange grows by one column per
rank, not per table.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from dlrm_contracts.binary_format import NUM_NUMERICAL
from dlrm_contracts.config import ConfigError
from trainer.dims import PRESETS, ModelDims, model_dims  # noqa: F401 — their home is TF-free
from trainer.placement import Piece, Placement


def interaction_pairs(num_features: int) -> np.ndarray:
    """Flat indices (i * F + j, i > j) of the lower triangle of a F x F matrix."""
    rows, cols = np.tril_indices(num_features, -1)
    return (rows * num_features + cols).astype(np.int32)


def dot_interaction(features: tf.Tensor) -> tf.Tensor:
    """[b, F, d] -> [b, d + F(F-1)/2]: feature 0 (bottom MLP output) then pairwise dots."""
    num_features = features.shape[1]
    products = tf.matmul(features, features, transpose_b=True)
    flat = tf.reshape(products, [-1, num_features * num_features])
    pairs = tf.gather(flat, interaction_pairs(num_features), axis=1)
    return tf.concat([features[:, 0, :], pairs], axis=1)


def pooled_lookup(table: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows of ``table`` at ``ids``: [B] -> [B, w] (one-hot), [B, k] -> [B, w] summed over the
    k ids of a row (multi-hot, sum pooling as MLPerf DLRMv2's embedding bags)."""
    rows = tf.gather(table, ids)
    return tf.reduce_sum(rows, axis=1) if ids.shape.rank == 2 else rows


class CrossNet(tf.Module):
    """DCNv2's low-rank cross layers (MLPerf DLRMv2's interaction) over x0 [b, N]:

        x_{l+1} = x0 * (up_l(down_l(x_l)) + bias_l) + x_l,   down_l: N -> r, up_l: r -> N

    Each layer multiplies the input element-wise with a low-rank linear map of the previous
    layer's output, so layer l holds products of up to l + 1 input features; the residual keeps
    the lower orders. Kernels are Xavier-normal from stateless seeds (like the MLPs: the same
    on every rank), biases start at 0 (as in the reference).
    """

    def __init__(self, width: int, layers: int, rank: int, seed: int, ident: int, name: str = "cross"):
        super().__init__(name=name)
        std = math.sqrt(2.0 / (width + rank))
        self.downs, self.ups, self.biases = [], [], []
        for i in range(layers):
            self.downs.append(
                tf.Variable(
                    tf.random.stateless_normal([width, rank], seed=[seed, ident + 2 * i], stddev=std),
                    name=f"{name}_{i}_down",
                )
            )
            self.ups.append(
                tf.Variable(
                    tf.random.stateless_normal([rank, width], seed=[seed, ident + 2 * i + 1], stddev=std),
                    name=f"{name}_{i}_up",
                )
            )
            self.biases.append(tf.Variable(tf.zeros([width]), name=f"{name}_{i}_bias"))

    def __call__(self, x0: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        x0 = tf.cast(x0, dtype)
        x = x0
        for down, up, bias in zip(self.downs, self.ups, self.biases):
            mapped = tf.matmul(tf.matmul(x, tf.cast(down, dtype)), tf.cast(up, dtype))
            x = x0 * (mapped + tf.cast(bias, dtype)) + x
        return x

    def named_variables(self) -> list[tuple[str, tf.Variable]]:
        out = []
        for i, (down, up, bias) in enumerate(zip(self.downs, self.ups, self.biases)):
            out += [
                (f"{self.name}/{i}/down", down),
                (f"{self.name}/{i}/up", up),
                (f"{self.name}/{i}/bias", bias),
            ]
        return out


def cross_sizes(width: int, layers: int, rank: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every cross-layer variable (what the export reads)."""
    out: dict[str, tuple[int, ...]] = {}
    for i in range(layers):
        out.update(
            {f"cross/{i}/down": (width, rank), f"cross/{i}/up": (rank, width), f"cross/{i}/bias": (width,)}
        )
    return out


def interaction(features: tf.Tensor, cross: CrossNet | None, dtype: tf.DType) -> tf.Tensor:
    """[b, F, d] (bottom MLP output first) -> the top MLP's input: the dot interaction, or
    (``cross`` given) the cross layers over the concatenation [b, F * d]."""
    if cross is None:
        return dot_interaction(features)
    return cross(tf.reshape(features, [-1, features.shape[1] * features.shape[2]]), dtype)


class MLP(tf.Module):
    """Dense layers with ReLU (the last one too unless ``final_relu`` is False)."""

    def __init__(
        self, in_dim: int, sizes: tuple[int, ...], seed: int, ident: int, final_relu: bool, name: str
    ):
        super().__init__(name=name)
        self.kernels, self.biases = [], []
        self.final_relu = final_relu
        for i, (fan_in, fan_out) in enumerate(zip((in_dim,) + sizes[:-1], sizes)):
            std = math.sqrt(2.0 / (fan_in + fan_out))
            self.kernels.append(
                tf.Variable(
                    tf.random.stateless_normal([fan_in, fan_out], seed=[seed, ident + 2 * i], stddev=std),
                    name=f"{name}_{i}_w",
                )
            )
            self.biases.append(
                tf.Variable(
                    tf.random.stateless_normal(
                        [fan_out], seed=[seed, ident + 2 * i + 1], stddev=math.sqrt(1.0 / fan_out)
                    ),
                    name=f"{name}_{i}_b",
                )
            )

    def __call__(self, x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        x = tf.cast(x, dtype)
        last = len(self.kernels) - 1
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            x = tf.matmul(x, tf.cast(w, dtype)) + tf.cast(b, dtype)
            if i < last or self.final_relu:
                x = tf.nn.relu(x)
        return x

    def named_variables(self) -> list[tuple[str, tf.Variable]]:
        out = []
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            out += [(f"{self.name}/{i}/kernel", w), (f"{self.name}/{i}/bias", b)]
        return out


def table_seed_ident(table: int, column: int) -> int:
    return 1_000_000 + table * 65_536 + column


def initial_table_column(piece: Piece, column: int, seed: int) -> tf.Tensor:
    """Column ``column`` of a table from its own seed: uniform(±1/sqrt(rows)) as the seed."""
    bound = 1.0 / math.sqrt(piece.rows)
    return tf.random.stateless_uniform(
        [piece.rows], seed=[seed, table_seed_ident(piece.table, column)], minval=-bound, maxval=bound
    )


def initial_table_piece(piece: Piece, seed: int) -> tf.Tensor:
    return tf.stack(
        [initial_table_column(piece, c, seed) for c in range(piece.col_start, piece.col_end)], axis=1
    )


def wide_key(table: int, dim: int) -> str:
    """A table's wide weights as checkpoints name them: its column ``dim`` (one past the
    embedding), so that reassembly, warm-start growth and export treat them as table columns."""
    return f"table/{table}/{dim}-{dim + 1}"


def wide_variable(piece: Piece, dim: int) -> tf.Variable:
    """[rows, 1] zeros: the model starts as the DLRM without the term (and a row added by
    a warm start too)."""
    return tf.Variable(tf.zeros([piece.rows, 1]), name=f"wide_{piece.table}_{dim}")


def table_variable(piece: Piece, seed: int) -> tf.Variable:
    """The piece's variable. Initialisation briefly holds two copies of the piece (columns are
    drawn separately, then stacked): one write of the whole piece, not one per column."""
    return tf.Variable(initial_table_piece(piece, seed), name=f"table_{piece.table}_{piece.col_start}")


class DLRM(tf.Module):
    """This rank's variables of the DLRM and its forward pass (see the module docstring)."""

    def __init__(
        self,
        dims: ModelDims,
        placement: Placement,
        rank: int,
        global_batch: int,
        seed: int,
        comm,
        compute_dtype: tf.DType = tf.float32,
        xla: bool = False,
    ):
        super().__init__(name="dlrm")
        if global_batch % placement.world:
            raise ConfigError(f"global batch {global_batch} must divide by the {placement.world} ranks")
        self.dims, self.placement, self.rank, self.comm = dims, placement, rank, comm
        self.compute_dtype = compute_dtype
        self.pieces = placement.pieces[rank]
        self.tables_read = placement.tables_of(rank)
        self._cat_index = {t: i for i, t in enumerate(self.tables_read)}
        self.tables = [table_variable(p, seed) for p in self.pieces]
        # The wide weights of the tables whose column 0 this rank holds (see the docstring).
        self.wide_pieces = [p for p in self.pieces if dims.wide and p.col_start == 0]
        self.wide = [wide_variable(p, dims.embedding_dim) for p in self.wide_pieces]
        self._wide_width = 1 if dims.wide else 0
        self.bottom_data_parallel = placement.bottom_owner is None
        self.owns_bottom = self.bottom_data_parallel or placement.bottom_owner == rank
        self.bottom = (
            MLP(NUM_NUMERICAL, dims.bottom_mlp, seed, 1000, True, "bottom") if self.owns_bottom else None
        )
        features = placement.exchanged_features() + (1 if self.bottom_data_parallel else 0)
        top_in = dims.top_input(features)
        self.cross = (
            CrossNet(top_in, dims.dcn_layers, dims.dcn_rank, seed, 3000)
            if dims.interaction == "dcn"
            else None
        )
        self.top = MLP(top_in, dims.top_mlp, seed, 2000, False, "top")
        self._columns = placement.feature_columns()
        self._identity_columns = bool(np.array_equal(self._columns, np.arange(len(self._columns))))
        self._dense = (
            tf.function(self.dense_part, jit_compile=True, autograph=False) if xla else self.dense_part
        )

    # -- variables, by how their gradients are combined ------------------------------------
    def replicated_variables(self) -> list[tuple[str, tf.Variable]]:
        """Same on every rank, gradients allreduced: cross layers and top MLP (+ bottom MLP if
        data parallel)."""
        out = (self.cross.named_variables() if self.cross is not None else []) + self.top.named_variables()
        if self.bottom_data_parallel:
            out = self.bottom.named_variables() + out
        return out

    def owned_variables(self) -> list[tuple[str, tf.Variable]]:
        """Only on this rank, gradients arrive through the alltoall: tables (+ bottom MLP)."""
        out = [(f"table/{p.table}/{p.col_start}-{p.col_end}", v) for p, v in zip(self.pieces, self.tables)]
        out += [(wide_key(p.table, self.dims.embedding_dim), v) for p, v in zip(self.wide_pieces, self.wide)]
        if self.owns_bottom and not self.bottom_data_parallel:
            out = self.bottom.named_variables() + out
        return out

    def wide_names(self) -> list[str]:
        """Names of this rank's wide variables, as ``owned_variables`` gives them."""
        return [wide_key(p.table, self.dims.embedding_dim) for p in self.wide_pieces]

    # -- forward ---------------------------------------------------------------------------
    def _owned_outputs(
        self, categorical: list[tf.Tensor], numerical: tf.Tensor | None, global_batch: int
    ) -> tf.Tensor:
        parts = []
        if self.owns_bottom and not self.bottom_data_parallel:
            parts.append(tf.cast(self.bottom(numerical, self.compute_dtype), tf.float32))
        for piece, table in zip(self.pieces, self.tables):
            parts.append(pooled_lookup(table, categorical[self._cat_index[piece.table]]))
        if self._wide_width and self.placement.world > 1:
            # this rank's partial first-order sum travels as the exchange's last column
            parts.append(self._wide_sum(categorical, global_batch)[:, None])
        if not parts:  # more ranks than tables: this rank only relays
            return tf.zeros([global_batch, 0], tf.float32)
        return tf.concat(parts, axis=1)

    def _wide_sum(self, categorical: list[tf.Tensor], batch: int) -> tf.Tensor:
        """[batch]: the sum of this rank's wide weights at each sample's ids."""
        # gather, then drop the column: the gradient stays sparse (the looked-up rows only)
        weights = [
            pooled_lookup(w, categorical[self._cat_index[p.table]])[:, 0]
            for p, w in zip(self.wide_pieces, self.wide)
        ]
        return tf.add_n(weights) if weights else tf.zeros([batch])

    def _exchange(self, owned: tf.Tensor, local_batch: int) -> tuple[tf.Tensor, tf.Tensor | None]:
        """[B, W_rank] on every rank -> ([b, F, d] features, [b] wide sum or None) of this
        rank's b samples (the sum when ``dims.wide`` on several ranks; one process adds its own,
        without a column to cut off)."""
        world, extra = self.placement.world, self._wide_width
        wide = None
        if world > 1:
            widths = [self.placement.sent_width(s) + extra for s in range(world)]
            sent = tf.reshape(owned, [-1])
            received = self.comm.alltoall(
                sent, [local_batch * widths[self.rank]] * world, name=f"dlrm_exchange_b{local_batch}"
            )
            blocks = tf.split(received, [local_batch * w for w in widths], axis=0)
            blocks = [tf.reshape(blk, [local_batch, w]) for blk, w in zip(blocks, widths)]
            if extra:
                wide = tf.add_n([blk[:, -1] for blk in blocks])
                blocks = [blk[:, :-1] for blk in blocks]
            owned = tf.concat(blocks, axis=1)
        if not self._identity_columns:
            owned = tf.gather(owned, self._columns, axis=1)
        return tf.reshape(
            owned, [local_batch, self.placement.exchanged_features(), self.dims.embedding_dim]
        ), wide

    def dense_part(self, numerical: tf.Tensor, features: tf.Tensor, wide: tf.Tensor) -> tf.Tensor:
        """Step 3 on the local samples: [bottom MLP], interaction, top MLP -> logits (+ the
        wide sum)."""
        features = tf.cast(features, self.compute_dtype)
        if self.bottom_data_parallel:
            bottom = self.bottom(numerical, self.compute_dtype)
            features = tf.concat([bottom[:, None, :], features], axis=1)
        logits = self.top(interaction(features, self.cross, self.compute_dtype), self.compute_dtype)
        return tf.cast(logits[:, 0], tf.float32) + wide

    def features(
        self, categorical: list[tf.Tensor], numerical: tf.Tensor, local_batch: int
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Steps 1-2: (numericals for the dense part, exchanged features [b, F, d], the wide
        sum [b]).

        ``categorical`` holds the global batch of ``tables_read``; ``numerical`` is the local
        slice (data-parallel bottom MLP), the whole batch (owner of a model-parallel bottom MLP)
        or empty.
        """
        global_numerical = numerical if not self.bottom_data_parallel else None
        owned = self._owned_outputs(categorical, global_numerical, local_batch * self.placement.world)
        features, wide = self._exchange(owned, local_batch)
        if wide is None:
            wide = self._wide_sum(categorical, local_batch) if self._wide_width else tf.zeros([local_batch])
        local_numerical = numerical if self.bottom_data_parallel else tf.zeros([local_batch, 0])
        return local_numerical, features, wide

    def __call__(self, categorical: list[tf.Tensor], numerical: tf.Tensor, local_batch: int) -> tf.Tensor:
        """Logits [local batch]."""
        return self._dense(*self.features(categorical, numerical, local_batch))
