{{/* Names, labels and the operator's arguments, shared by every template. */}}

{{- define "inferfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>", or the release name alone when it already contains the chart name. */}}
{{- define "inferfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "inferfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inferfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "inferfleet.labels" -}}
app.kubernetes.io/name: {{ include "inferfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "inferfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "inferfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "inferfleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* True (non-empty) when more than one operator pod runs and they must elect a leader. */}}
{{- define "inferfleet.peering.enabled" -}}
{{- if gt (int .Values.replicaCount) 1 -}}true{{- end -}}
{{- end -}}

{{/*
Whether the API server served a kind when this release was rendered. Objects of the chart's own
CRDs (the default runtimes, the peering object) can only be created once their CRD is served:
helm builds every object of a release before creating any, so on the install that creates the
CRDs they are left to the next upgrade (NOTES.txt says so).
*/}}
{{- define "inferfleet.runtimes.served" -}}
{{- if .Capabilities.APIVersions.Has "inferfleet.dev/v1alpha1/InferenceRuntime" -}}true{{- end -}}
{{- end -}}

{{- define "inferfleet.peering.served" -}}
{{- $kind := ternary "KopfPeering" "ClusterKopfPeering" (gt (len .Values.watchNamespaces) 0) -}}
{{- if .Capabilities.APIVersions.Has (printf "kopf.dev/v1/%s" $kind) -}}true{{- end -}}
{{- end -}}

{{- define "inferfleet.peering.name" -}}
{{- default (include "inferfleet.fullname" .) .Values.leaderElection.peeringName -}}
{{- end -}}

{{/* The engine cache claim the operator is told about; empty when there is none. */}}
{{- define "inferfleet.engineCache.claim" -}}
{{- if .Values.engineCache.existingClaim -}}
{{- .Values.engineCache.existingClaim -}}
{{- else if .Values.engineCache.create -}}
{{- printf "%s-engine-cache" (include "inferfleet.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "inferfleet.args" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --health-port={{ .Values.healthPort }}
- --metrics-port={{ .Values.metricsPort }}
{{- if include "inferfleet.peering.enabled" . }}
- --peering={{ include "inferfleet.peering.name" . }}
{{- end }}
{{- with include "inferfleet.engineCache.claim" . }}
- --engine-cache-claim={{ . }}
{{- end }}
{{- if not (include "inferfleet.routing.enabled" .) }}
- --inference-pools=disabled
{{- end }}
{{- if .Values.engineCache.shareAcrossNamespaces }}
- --share-engines-across-namespaces
{{- end }}
{{- range .Values.modelHostPaths.allowedRoots }}
- {{ printf "--model-host-path-root=%s" . | quote }}
{{- end }}
{{- with .Values.modelCache.claimName }}
- --model-cache-claim={{ . }}
{{- end }}
{{- with .Values.modelCache.budget }}
- --model-cache-budget={{ . }}
{{- end }}
- --router-image={{ include "inferfleet.image" . }}
{{- with .Values.image.pullPolicy }}
- --router-image-pull-policy={{ . }}
{{- end }}
- --scraper-namespace={{ .Release.Namespace }}
{{- $scraper := include "inferfleet.selectorLabels" . | fromYaml }}
- --scraper-labels={{ range $i, $key := keys $scraper | sortAlpha }}{{ if $i }},{{ end }}{{ $key }}={{ get $scraper $key }}{{ end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Kinds that are cluster-scoped, by resource name. In namespaced mode (watchNamespaces set) rules
on these go to the ClusterRole and every other rule goes to a Role in each watched namespace.
*/}}
{{- define "inferfleet.clusterScopedResources" -}}
{{- list "nodes" "namespaces" "persistentvolumes" "storageclasses" "customresourcedefinitions" "inferenceruntimes" "clusterkopfpeerings" "priorityclasses" "runtimeclasses" "csidrivers" "csinodes" "volumeattachments" "apiservices" "ingressclasses" "clusterroles" "clusterrolebindings" | toJson -}}
{{- end -}}

{{/*
Kinds only an operator watching every namespace uses: in namespaced mode the pods elect their
leader through a KopfPeering in each watched namespace, so no rule on these is granted and the
ClusterRole holds reads only.
*/}}
{{- define "inferfleet.clusterwideOnlyResources" -}}
{{- list "clusterkopfpeerings" | toJson -}}
{{- end -}}

{{/*
Every RBAC rule the operator needs: inferfleet_operator.plan.permissions.PERMISSIONS, read from
files/rbac/permissions.yaml (a copy kept equal by tests/charts). It already holds kopf's
peering kinds, used when several pods elect a leader.
*/}}
{{/*
"true" when the operator may write InferencePools: routing.inferencePools true, or "auto" and the
cluster serves inference.networking.k8s.io/v1 InferencePool at install or upgrade time.
*/}}
{{- define "inferfleet.routing.enabled" -}}
{{- $value := toString .Values.routing.inferencePools -}}
{{- if or (eq $value "true") (and (eq $value "auto") (.Capabilities.APIVersions.Has "inference.networking.k8s.io/v1/InferencePool")) -}}true{{- end -}}
{{- end -}}

{{- define "inferfleet.rules.all" -}}
{{- $rules := .Files.Get "files/rbac/permissions.yaml" | fromYamlArray -}}
{{- if include "inferfleet.routing.enabled" . -}}
{{- $rules = concat $rules (.Files.Get "files/rbac/routing-permissions.yaml" | fromYamlArray) -}}
{{- end -}}
{{- $rules | toJson -}}
{{- end -}}

{{/*
The rules of namespaced mode for one scope: "cluster" keeps the resources in clusterScopedResources
(and nonResourceURLs), "namespaced" keeps the others; neither keeps clusterwideOnlyResources. A
rule whose resources span both is split.
Call with (dict "root" $ "scope" "cluster").
*/}}
{{- define "inferfleet.rules.forScope" -}}
{{- $clusterScoped := include "inferfleet.clusterScopedResources" .root | fromJsonArray -}}
{{- $clusterwideOnly := include "inferfleet.clusterwideOnlyResources" .root | fromJsonArray -}}
{{- $out := list -}}
{{- range $rule := include "inferfleet.rules.all" .root | fromJsonArray -}}
{{- if hasKey $rule "nonResourceURLs" -}}
{{- if eq $.scope "cluster" -}}{{- $out = append $out $rule -}}{{- end -}}
{{- else -}}
{{- $kept := list -}}
{{- range $resource := $rule.resources -}}
{{- $isCluster := has (first (splitList "/" $resource)) $clusterScoped -}}
{{- $isUnused := has (first (splitList "/" $resource)) $clusterwideOnly -}}
{{- if and (eq $isCluster (eq $.scope "cluster")) (not $isUnused) -}}{{- $kept = append $kept $resource -}}{{- end -}}
{{- end -}}
{{- if $kept -}}{{- $out = append $out (set (deepCopy $rule) "resources" $kept) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Checks across values that values.schema.json cannot express; each failure names the values. */}}
{{- define "inferfleet.validate" -}}
{{- if eq (int .Values.healthPort) (int .Values.metricsPort) -}}
{{- fail (printf "healthPort and metricsPort must differ (both are %d)" (int .Values.healthPort)) -}}
{{- end -}}
{{- $pdb := .Values.podDisruptionBudget -}}
{{- if and (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) -}}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" -}}
{{- end -}}
{{- end -}}
