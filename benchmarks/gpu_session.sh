#!/usr/bin/env bash
# The checks to run on one lent GPU: about 7 minutes on an H100 for all six steps, too
# close to the device tool's 10-minute limit per command for one call; run them as two,
# STEPS="1 2 3" and then STEPS="1 4 5 6" (step 1, about 1.5 minutes, makes the profile the
# others validate on).
#
# From the repository root on the GPU machine, with a simpy wheel carried in .whl/ (the
# machine's image has torch, numpy, pandas, matplotlib, PyYAML and tqdm, not simpy; see
# benchmarks/GPU_RUNS.md):
#     bash benchmarks/gpu_session.sh            # all steps, into $OUT (the device tool's folder)
#     STEPS="1 3 5" bash benchmarks/gpu_session.sh   # only these steps (1 is always needed
#                                                    # by 3 and 5: they validate on its profile)
#
# 1. env.txt            nvidia-smi and torch versions
# 2. <base>-1gpu.yaml   the datasheet profile of this GPU kind with what one GPU measures merged
#    + .raw.csv         in (plansim calibrate --nproc 1: GEMMs, attention, HBM, host, sustained
#                       GEMM rate; the collectives and gpus_per_node stay the datasheet's)
# 3. layer_shapes.csv   one layer's weight GEMMs of MPT 125M-70B and Megatron 22B/175B (tp 8),
#                       forward, input- and weight-gradient, and causal attention calls of
#                       MPT, Llama 3 and GPT-3 shapes, measured against both profiles
#                       (benchmarks/bench_layer_shapes.py)
# 4. validate.tgz       plansim validate of a 1-GPU plan (GPT, 8 layers, h 2048, s 2048) without
#                       and with full recompute on the merged profile: the validate runner
#                       in fp32 (the datasheet profiles have no fp32 GEMM curve)
# 5. mechanisms.csv     benchmarks/bench_gpu_mechanisms.py: fp32 vs bf16 sustained GEMM rate,
#                       torch checkpoint early stop on / off / reentrant, cold vs warm GEMMs,
#                       the GEMM rate by GEMM share of the device's time (duty)
# 6. validate_bf16.tgz  plansim validate in bf16 mixed precision (Megatron-LM's recipe:
#                       plansim/validate/mixed_precision.py) of the same GPT with and without
#                       full recompute, a 4-layer 4096-wide GPT, and 4 layers of Llama 3 8B
#                       (GQA, SwiGLU, RoPE, vocabulary 128256, s 4096) on the merged profile
# 7. kernels*.csv       benchmarks/profile_validate_kernels.py: one micro-batch of the validate
#                       GPT, fp32 and bf16, kernel by kernel (step 6)
# 8. runs_<dtype>.csv   benchmarks/bench_layer_shapes.py --runs: every weight GEMM and attention
#                       call of one layer of the published NeMo runs on this GPU kind
#                       (benchmarks/published_runs/nemo_performance.csv), fp8 and bf16, against
#                       the datasheet profile and the measured one (this run's step 1, else
#                       the committed <base>-1gpu profile)
# 9. sustained.csv      bench_gpu_mechanisms.py --part sustained: burst and sustained 8192^3
#                       GEMM rate in fp32, bf16 and fp8 (15 s soaks)
# 10. steps.log         everything printed
set -uo pipefail
OUT=${OUT:-gpu-run-out}
mkdir -p "$OUT"

run_steps() {
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/plansim-site .whl/*.whl || return 1
    export PYTHONPATH=/tmp/plansim-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=" ${STEPS:-1 2 3 4 5 6} "
want() { [[ "$steps" == *" $1 "* ]]; }
python3 -c "import simpy, torch; assert torch.cuda.is_available(), 'no GPU'" || return 1

{ nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } >"$OUT/env.txt" 2>&1
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
case "$gpu" in
    *H200*) base=h200-sxm-141gb ;;
    *H100*) base=h100-sxm5-80gb ;;
    *B200*) base=b200-sxm-180gb ;;
    *A100*80*) base=a100-sxm4-80gb ;;
    *A100*) base=a100-sxm4-40gb ;;
    *) echo "no datasheet profile for '$gpu'"; return 1 ;;
esac
measured="$OUT/$base-1gpu.yaml"
echo "== $gpu: base profile $base"

if want 1; then
    echo "== 1/6 calibrate (one GPU, quick) into a copy of $base"
    cp "hardware_profiles/$base.yaml" "$measured"
    timeout 200 python3 -m plansim calibrate --backend nccl --nproc 1 --device cuda --quick \
        --out "$measured" --name "$base-1gpu" --timeout 180
fi

if want 2; then
    echo "== 2/6 GEMMs and attention of real layer shapes"
    profiles=(--profile "$base")
    [ -s "${measured%.yaml}.raw.csv" ] && profiles+=(--profile "$measured")
    timeout 120 python3 benchmarks/bench_layer_shapes.py --device cuda "${profiles[@]}" \
        --out "$OUT/layer_shapes.csv" --timeout 110
fi

gpt=(--model gpt3-175b --num-layers 8 --hidden-size 2048 --num-heads 16 --seq-len 2048
     --vocab-size 50304 --tp 1 --pp 1 --mbs 2 --gbs 4 --backend nccl --nproc 1 --steps 5)
# the GPT above without and with full recompute, in dtype $1, into folder $2
validate_gpt() {
    for recompute in none full; do
        timeout 60 python3 -m plansim validate "${gpt[@]}" --recompute "$recompute" \
            --dtype "$1" --profile "$measured" --out "$2/gpt-h2048-$recompute"
    done
}
if want 3; then
    echo "== 3/6 validate one GPU (fp32) against the merged profile"
    work=$(mktemp -d)
    validate_gpt fp32 "$work"
    tar czf "$OUT/validate.tgz" -C "$work" .
fi

if want 4; then
    echo "== 4/6 mechanisms: sustained rate per dtype, checkpoint early stop, cold vs warm GEMMs, duty"
    timeout 200 python3 benchmarks/bench_gpu_mechanisms.py --device cuda --out "$OUT/mechanisms.csv"
fi

if want 5; then
    echo "== 5/6 validate one GPU in bf16 mixed precision against the merged profile"
    work=$(mktemp -d)
    validate_gpt bf16 "$work"
    timeout 60 python3 -m plansim validate --model gpt3-175b --num-layers 4 --hidden-size 4096 \
        --num-heads 32 --seq-len 2048 --vocab-size 50304 --tp 1 --pp 1 --mbs 1 --gbs 4 \
        --backend nccl --nproc 1 --steps 5 --dtype bf16 --profile "$measured" \
        --out "$work/gpt-h4096-none"
    timeout 90 python3 -m plansim validate --model llama3-8b --num-layers 4 --seq-len 4096 \
        --tp 1 --pp 1 --mbs 1 --gbs 2 --backend nccl --nproc 1 --steps 5 --dtype bf16 \
        --profile "$measured" --out "$work/llama3-8b-l4-none"
    tar czf "$OUT/validate_bf16.tgz" -C "$work" .
fi

if want 6; then
    echo "== 6/6 one micro-batch of the validate GPT, kernel by kernel (fp32, bf16)"
    timeout 100 python3 benchmarks/profile_validate_kernels.py --device cuda \
        --out "$OUT/kernels.csv" --kernels-out "$OUT/kernels_names.csv"
fi
if want 7; then
    echo "== 7/7 the published NeMo runs' layers on this GPU kind, fp8 and bf16; sustained rate by dtype"
    profiles=(--profile "$base")
    if [ -s "${measured%.yaml}.raw.csv" ]; then profiles+=(--profile "$measured")
    elif [ -s "hardware_profiles/$base-1gpu.yaml" ]; then profiles+=(--profile "$base-1gpu"); fi
    for dtype in fp8 bf16; do
        timeout 200 python3 benchmarks/bench_layer_shapes.py --device cuda "${profiles[@]}" \
            --runs benchmarks/published_runs/nemo_performance.csv --gpu-type "$base" \
            --dtype "$dtype" --out "$OUT/runs_$dtype.csv" --timeout 190
    done
    timeout 120 python3 benchmarks/bench_gpu_mechanisms.py --device cuda --part sustained \
        --sustained-dtypes fp32,bf16,fp8 --out "$OUT/sustained.csv"
fi
echo "== done: $(ls "$OUT" | tr '\n' ' ')"
}

run_steps 2>&1 | tee "$OUT/steps.log"
