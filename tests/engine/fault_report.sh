#!/usr/bin/env bash
# A report, not a test (test_cli_faults asserts the same cases): each store-safety, signal and
# refused-input case as a user meets it, with its exit status, seconds and the first line it said,
# so two builds can be compared side by side.
#   tests/engine/fault_report.sh build/traindeck projects
set -u
TD=$1; P=$2
W=$(mktemp -d); chmod 755 "$W"; cd "$W"
PY=/usr/bin/python3
row() { # name, then the command
  local name=$1; shift
  local t0=$(date +%s.%N)
  "$@" >out.txt 2>err.txt; local rc=$?
  local t1=$(date +%s.%N)
  local msg=$( (grep -h -m1 -E "error|warning|expected|Stopp|stopped|must|range" err.txt out.txt || tail -n1 out.txt) | head -c 300 | tr '\n' ' ')
  printf '%-28s exit %-3s %6.2fs  %s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$msg"
}
$PY - "$P" <<'PY'
import json,sys
p=json.load(open(sys.argv[1]+'/synthetic_blobs.json'))
p['training']['epochs']=1
json.dump(p,open('a.json','w'))
p['model']['config']['layers'][1]['config']['units']=64
json.dump(p,open('b.json','w'))
p['training']['epochs']=100000
json.dump(p,open('long.json','w'))
q=json.load(open(sys.argv[1]+'/synthetic_blobs.json'))
q['training']['optimizer']['config']['learning_rate']='LR'
open('lr.json','w').write(json.dumps(q).replace('"LR"','1e999'))
PY
$TD train a.json --db "$W/a.db" --run-name A --plain >/dev/null 2>&1
$TD train b.json --db "$W/b.db" --run-name B --plain >/dev/null 2>&1
row "two stores: export A" $TD export A --db "$W/a.db" -o A.keras
$PY -c "import zipfile,json;c=json.loads(zipfile.ZipFile('A.keras').read('config.json'));print('   A.keras first Dense units:',c['config']['layers'][1]['config']['units'] if c['config']['layers'][0].get('class_name')=='InputLayer' else c['config']['layers'][0]['config']['units'])" 2>/dev/null
mkdir -p rel other; (cd rel && $TD train ../a.json --db r.db --run-name R --plain >/dev/null 2>&1)
cd other; row "relative --db: export" $TD export R --db ../rel/r.db -o R.keras; cd "$W"
for sig in TERM INT HUP; do
  mkdir -p "$W/sig$sig"; cd "$W/sig$sig"
  env --default-signal=INT $TD train ../long.json --db "$W/sig$sig/s.db" --run-name S --plain >sig.out 2>sig.err & pid=$!
  for i in $(seq 100); do grep -q "Epoch 3" sig.out 2>/dev/null && break; sleep 0.1; done
  t0=$(date +%s.%N); kill -$sig $pid; wait $pid; rc=$?; t1=$(date +%s.%N)
  st=$($TD runs --db "$W/sig$sig/s.db" --json 2>/dev/null | $PY -c "import json,sys;r=json.load(sys.stdin);print(r[0]['status'])" 2>/dev/null)
  printf '%-28s exit %-3s %6.2fs  %s | status %s, checkpoint files %s\n' "SIG$sig during train" $rc "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$(cat sig.err | tr '\n' ' ' | head -c 200)" "$st" "$(find . -name '*.tdckpt' | wc -l)"
  cd "$W"
done
$PY -c "print('{\"description\":'+'['*100000+']'*100000+',\"format\":\"traindeck-project\",\"name\":\"x\"}')" > deep.json
row "deep JSON: summary" $TD summary deep.json
$PY - <<'PY'
import zipfile
z=zipfile.ZipFile('deep.keras','w')
z.writestr('metadata.json','{"keras_version":"3.0.0"}')
z.writestr('config.json','{"a":'+'['*100000+']'*100000+',"class_name":"Sequential"}')
z.writestr('model.weights.h5','')
z.close()
PY
row "deep JSON: import .keras" $TD import deep.keras -o x.json
row "deep JSON: predict .keras" $TD predict deep.keras a.json
mkdir -p ro; cp -r a.db checkpoints ro/; chmod 555 ro; chmod -R a-w ro
if command -v setpriv >/dev/null; then RO="setpriv --reuid=65534 --regid=65534 --clear-groups"; else RO=""; fi
row "read-only: runs --json" $RO $TD runs --db "$W/ro/a.db" --json
row "read-only: show" $RO $TD show A --db "$W/ro/a.db"
row "read-only: export" $RO $TD export A --db "$W/ro/a.db" -o /tmp/ro-A-$$.keras
row "read-only: train" $RO $TD train a.json --db "$W/ro/a.db"
$PY - <<'PY'
import numpy as np, json
np.save('x.npy', np.random.rand(64,16).astype('float32'))
np.save('y.npy', np.random.randint(0,4,64).astype('float32')+0.5)
p=json.load(open('a.json'))
p["data"]["source"]={"type":"npy","train_x":"x.npy","train_y":"y.npy"}
json.dump(p,open('npy.json','w'))
np.save('wrong.npy', np.random.rand(4,4,4).astype('float32'))
a=np.random.rand(4,16).astype('float32'); a[0,0]=np.nan; np.save('nan.npy',a)
PY
row "float labels in NPY" $TD train npy.json --db "$W/n.db"
row "learning_rate 1e999" $TD summary lr.json
row "--batch-size 0" $TD train a.json --batch-size 0 --db "$W/z.db"
row "summary X.keras" $TD summary A.keras
ck=$(find "$W" -name '*.tdckpt' | head -1)
row "export --weights X.tdckpt" $TD export --project a.json --weights "$ck" -o w.keras
row "too long --run-name" $TD train a.json --run-name "$(head -c 5000 /dev/zero | tr '\0' n)" --db "$W/l.db"
row "predict other shape" $TD predict A.keras wrong.npy
row "predict NaN input" $TD predict A.keras nan.npy
chmod -R u+w "$W"; rm -rf "$W"
