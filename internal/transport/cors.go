package transport

import (
	"net/http"

	connectcors "connectrpc.com/cors"
	"github.com/rs/cors"
)

// corsMaxAge is how long a browser may cache a preflight's answer, in
// seconds.
const corsMaxAge = 7200

// CORS lets browser clients on origins (exact origins such as
// https://shop.example.com; "*" for any) call h with Connect, gRPC-Web and
// the admin API's bearer token; the headers Connect and gRPC-Web need are
// connectrpc.com/cors's. No origins: h as it is, and browsers on other
// origins are refused by their own same-origin rule.
func CORS(h http.Handler, origins []string) http.Handler {
	if len(origins) == 0 {
		return h
	}
	return cors.New(cors.Options{
		AllowedOrigins: origins,
		AllowedMethods: connectcors.AllowedMethods(),
		AllowedHeaders: append(connectcors.AllowedHeaders(), "Authorization"),
		ExposedHeaders: connectcors.ExposedHeaders(),
		MaxAge:         corsMaxAge,
	}).Handler(h)
}
