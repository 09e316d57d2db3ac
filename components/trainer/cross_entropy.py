"""The cross-entropy phase as a `Phase` value (Xu et al. 2015, 4.2; `train.objective=xe`, and SCST's start).

It trains `train.epochs` epochs (at most `train.max_steps` steps) with the
config's optimizer on its learning-rate schedule, from the initializers or
`train.init_model`, with the token-weighted step of components/trainer/step.py;
it logs the `train/*` scalars, and keeps the best model and stops early on
`train.early_stopping_metric`. Under hard attention the epochs of the
expected-alpha warmup train a soft model: they are no best-model candidates.
Its checkpoints, history and `best.keras` live in the work folder itself.
"""
from __future__ import annotations

import functools

from components.trainer import distribute, summaries
from components.trainer.phase import Handoff, LoopSetup, Phase


def cross_entropy_phase(setup: LoopSetup, handoff: Handoff | None = None) -> Phase:
    """The cross-entropy `Phase` of the run `setup` (the first phase: no `handoff`)."""
    tcfg, inputs = setup.config.train, setup.inputs
    normalizer, normalizer_line = token_normalizer(tcfg, inputs.data)
    announce = _announce(setup)
    if normalizer_line and setup.role.is_chief:
        announce += (normalizer_line,)
    return Phase(
        name="xe", folder="", inputs=inputs,
        make_optimizer=functools.partial(_make_optimizer, tcfg, inputs.total_steps),
        init_weights=functools.partial(_init_weights, init_model=tcfg.init_model),
        make_step=functools.partial(_make_step, tcfg=tcfg, token_normalizer=normalizer),
        announce=announce, write_summaries=_write_summaries,
        progress="Trainer", stopped="stopped",
        epochs=tcfg.epochs, total_steps=inputs.total_steps,
        metric=tcfg.early_stopping_metric, patience=tcfg.patience,
        first_candidate=warmup_steps)


def _make_optimizer(tcfg, total_steps: int):
    """`train.optimizer` on the learning-rate schedule of the phase's steps."""
    from components.trainer.model_setup import make_optimizer
    return make_optimizer(tcfg, total_steps)


def _init_weights(model, chief: bool, say, *, init_model: str) -> None:
    """The initializers' weights, or those of `train.init_model`."""
    if init_model:
        from components.trainer.model_setup import load_weights
        source = load_weights(model, init_model)
        say(f"starting from the weights of {source}")


def _make_step(strategy, model, optimizer, element_spec, *, tcfg,
               token_normalizer: float | None):
    """`run_step(batch, step)`: the cross-entropy step (components/trainer/step.py)."""
    from components.trainer.step import make_train_step
    step_fn = make_train_step(
        strategy, model, optimizer, clip_norm=tcfg.clip_norm,
        global_batch_size=tcfg.batch_size, element_spec=element_spec,
        jit_compile=tcfg.jit_compile, token_normalizer=token_normalizer)

    def run_step(batch, step: int) -> dict:
        return {k: float(v) for k, v in step_fn(batch).items()}

    return run_step


def _write_summaries(writer, step: int, out: dict, *, model, optimizer, timing) -> None:
    """The `train/*` scalars of one step."""
    summaries.write_step_summaries(
        writer, step, out, optimizer,
        hard=model.options.samples, located=model.located,
        throughput=timing.throughput(), wait_fraction=timing.wait_fraction())


def warmup_steps(model) -> int:
    """Hard attention's expected-alpha warmup trains a soft model: its steps (else 0)."""
    return model.options.expected_alpha_warmup if model.options.hard else 0


def token_normalizer(tcfg, data) -> tuple[float | None, str]:
    """Under `bucket_by_length`: the expected tokens of a global batch, and the line saying so.

    Bucketed batches hold captions of similar lengths. Dividing each batch's
    summed token losses by its own token count would give a token of a
    short caption several times the weight of a token of a long one; a
    constant keeps every token's weight the same, as in shuffled batches.

    Returns:
      `(normalizer, log line)`, `(None, "")` without bucketing.
    """
    if not tcfg.bucket_by_length:
        return None, ""
    mean_tokens = data.mean_caption_tokens()
    normalizer = mean_tokens * tcfg.batch_size
    return normalizer, (f"bucket_by_length: token losses divided by {normalizer:.0f} "
                        f"({tcfg.batch_size} captions x {mean_tokens:.2f} tokens on average)")


def _announce(setup: LoopSetup) -> tuple[str, ...]:
    """The run's strategy, data, model and precision (the chief), or this worker's part."""
    tcfg, role, inputs, precision = (setup.config.train, setup.role, setup.inputs,
                                     setup.precision)
    if not role.is_chief:
        return (f"{role.task_type}:{role.task_id} of {role.num_workers} workers: "
                "training with the chief; saves go to temporary folders",)
    multi_worker = distribute.is_multi_worker(setup.strategy)
    return (f"strategy {tcfg.strategy} "
            f"({setup.strategy.num_replicas_in_sync} replica(s)"
            + (f", {role.num_workers} workers, task {role.task_type}:{role.task_id}"
               if multi_worker else "")
            + f"), {inputs.data.num_records} train images, {inputs.steps_per_epoch} "
              f"steps/epoch x {tcfg.epochs} epochs (at most {inputs.total_steps} steps), "
              f"{len(inputs.eval_set)} val images, attention {setup.config.model.attention}"
              f", vocabulary {inputs.vocab_size}, grid {inputs.grid_shape}, "
              f"precision {precision.policy} ({precision.requested}: "
              f"{precision.reason})",
            f"train split {inputs.data.cache_reason}")
