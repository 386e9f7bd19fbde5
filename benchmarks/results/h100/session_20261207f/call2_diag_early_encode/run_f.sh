# session 2026-12-07f device call (untracked helper): on an H200 the issue 13 table (committed front end) + diag13;
# on an H100 the GEMM-vs-M sweep, diag13 and an A/B of the early first encode at c16
O=$OUT; G=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$G"
PYTHONPATH=. timeout 100 python benchmarks/gemm_m_sweep.py --out $O/gemm_m.json > $O/gemm_m.log 2>&1; tail -2 $O/gemm_m.log
if echo "$G" | grep -q H200; then
  cp benchmarks/_base/batch_encode.py benchmarks/_base/serving.py tachyon/server/
  OUT=$O END_S=540 SERVER_ARGS="--log-level debug" LOADS13="c16 poisson20" PARTS="serve13 diag13" bash benchmarks/gpu_session_t.sh 2>&1 | tail -30
else
  OUT=$O END_S=330 PARTS="diag13" bash benchmarks/gpu_session_t.sh 2>&1 | tail -8; mv $O/logs.tgz $O/logs_diag.tgz
  for t in early base; do
    [ $t = base ] && cp benchmarks/_base/batch_encode.py benchmarks/_base/serving.py tachyon/server/
    mkdir -p $O/$t; OUT=$O/$t END_S=290 LOADS13=c16 SERVER_ARGS="--log-level debug" PARTS=serve13 bash benchmarks/gpu_session_t.sh 2>&1 | grep -E "P99 TTFT|Mean TTFT"
  done
fi
ls $O
