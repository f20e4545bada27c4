"""The bench's text model: it builds, trains a step on its own synthetic token batches, and its
embedding's gradient is sparse (``tf.IndexedSlices``), unlike every other bench model's."""

import numpy as np
import tensorflow as tf

from hvd_overlap.tools.models import NUM_CLASSES, SEQUENCE, build_model, synthetic_batch


def test_text_model_trains_on_tokens_with_sparse_embedding_gradients():
    model = build_model("text", tiny=True)
    vocab = model.layers[0].input_dim
    x, y = synthetic_batch(8, seed=1, model="text", tiny=True)
    assert x.shape == (8, SEQUENCE) and x.dtype == np.int32
    assert 0 <= x.min() and x.max() < vocab and y.max() < NUM_CLASSES
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    grads = tape.gradient(value, model.trainable_variables)
    embedding = model.layers[0].embeddings  # (its layer's name depends on earlier tests)
    sparse = {v.ref(): isinstance(g, tf.IndexedSlices)
              for v, g in zip(model.trainable_variables, grads, strict=True)}
    assert sparse.pop(embedding.ref()) and not any(sparse.values())
    model.compile(tf.keras.optimizers.SGD(0.1), loss)
    before = model.layers[0].embeddings.numpy().copy()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = model.layers[0].embeddings.numpy()
    touched = np.unique(x)
    assert not np.allclose(before[touched], after[touched])
    untouched = np.setdiff1d(np.arange(vocab), touched)
    np.testing.assert_array_equal(before[untouched], after[untouched])


def test_full_text_model_size_and_image_models_keep_images():
    model = build_model("text")
    assert model.layers[0].input_dim == 20000 and model.layers[0].output_dim == 64
    assert model.count_params() == 20000 * 64 + 64 * 256 + 256 + 256 * 10 + 10
    x, _ = synthetic_batch(2, model="vgg")
    assert x.shape == (2, 32, 32, 3) and x.dtype == np.float32
