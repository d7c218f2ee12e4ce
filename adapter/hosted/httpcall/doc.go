// Package httpcall is what every hosted provider (E2B, Daytona, Sprites)
// would otherwise write again around its REST API: one error type
// ([Error]) carrying the provider, the HTTP status, the taxonomy kind and
// a redacted message; a per-provider error [Table] that classifies an
// answer as data (status, code, whose body, which call → kind); the
// transport-failure mapping and the [Redactor] written once; and one HTTP
// [Caller] (request building, the credential header, JSON decoding,
// reading the whole body before judging it, no redirects).
//
// A provider keeps only what differs: its error table, how it reads its
// own error body, and its routes. Retries and paging stay above, in the
// portable adapter (adapter.WithBackoff, hosted.ListAll).
//
// Invariants: httpcall imports only the standard library, adapter and
// adapter/secret (deps_test.go). A secret never reaches an error's text,
// and a transport failure never quotes the request URL. It holds no
// goroutines.
package httpcall
