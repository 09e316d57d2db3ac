"""ShowAttendTell under MirroredStrategy on two logical CPU devices (a subprocess: the
devices must be split before TensorFlow initialises)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tests.models.tiny import CAPTIONS, annotations, make_model

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = make_model("hard", dropout=0.0, expected_alpha_prob=0.0)
    a = np.concatenate([annotations(0), annotations(1)])             # 4 images
    tokens = np.concatenate([CAPTIONS, CAPTIONS])                    # 7 real tokens per replica
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((a, tokens)).batch(4))

    @tf.function
    def step(batch):
        def replica(a, t):
            terms = model.compute_loss_terms(a, t, training=False, global_batch_size=4)
            model.update_baseline(terms["reward"])
            return terms["loss"], terms["reward"]
        loss, reward = strategy.run(replica, args=batch)
        return (strategy.reduce("SUM", loss, None), strategy.reduce("MEAN", reward, None))

    loss, reward = step(next(iter(data)))
    single = model.compute_loss_terms(a, tokens, training=False)
    replicas = [float(v.numpy()) for v in
                strategy.experimental_local_results(model.reward_baseline.value)]
    print(json.dumps({"loss": float(loss), "single_loss": float(single["loss"]),
                      "reward": float(reward), "single_reward": float(single["reward"]),
                      "baselines": replicas}))
""")


@pytest.mark.slow
def test_mirrored_strategy_loss_scaling_and_shared_baseline():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Replica losses scaled by local / global batch sum to the whole batch's loss
    # (exact here: both replicas hold the same number of real tokens).
    assert abs(out["loss"] - out["single_loss"]) < 1e-4 * abs(out["single_loss"])
    assert abs(out["reward"] - out["single_reward"]) < 1e-4 * abs(out["single_reward"])
    # The mean-aggregated baseline: one value on every replica, the mean reward.
    first, second = out["baselines"]
    assert first == second
    assert abs(first - out["single_reward"]) < 1e-4 * abs(out["single_reward"])
