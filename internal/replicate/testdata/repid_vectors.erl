%% Computes the replication-id test vectors of id_test.go with Erlang/OTP itself.
%% Run: erlc ibrowse_lib.erl vec.erl (ibrowse_lib.erl from apache/couchdb-ibrowse,
%% with its eunit include removed) && erl -noshell -s vec main
-module(vec).
-export([main/0]).
-include("ibrowse.hrl").

%% Same as couch_replicator_ids:get_v4_url_info/1 (uses the real ibrowse_lib).
url_info(Url) ->
    case ibrowse_lib:parse_url(Url) of
        {error, invalid_uri} -> {Url, undefined, undefined};
        #url{protocol = S, host = H, port = P, path = Path} -> {H, ndp(S, P), Path}
    end.
ndp(https, 443) -> default;
ndp(http, 80) -> default;
ndp(http, 5984) -> default;
ndp(_, P) -> P.

ep(Url, User, Headers) ->
    {H, P, Path} = url_info(Url),
    {remote, User, H, P, Path, Headers, undefined}.

hex(Parts) ->
    <<N:128>> = crypto:hash(md5, term_to_binary(Parts, [{minor_version, 1}])),
    lists:flatten(io_lib:format("~32.16.0b", [N])).

out(Name, Parts) -> io:format("~s ~s~n", [Name, hex(Parts)]).

main() ->
    U = <<"7d9c2a6b3f1e4d5c8a9b0c1d2e3f4a5b">>,
    Tgt = ep("http://localhost:5984/tgt/", undefined, []),
    S = fun(Url) -> ep(Url, undefined, []) end,
    %% http_v4_endpoint_test_ rows (couch_replicator_ids.erl), as source
    out("v4_http_host", [U, S("http://host/"), Tgt]),
    out("v4_https_host", [U, S("https://host/"), Tgt]),
    out("v4_http_5984", [U, S("http://host:5984/"), Tgt]),
    out("v4_http_port1", [U, S("http://host:1/"), Tgt]),
    out("v4_https_port2", [U, S("https://host:2/"), Tgt]),
    out("v4_header_hv", [U, ep("http://host/", undefined, [{"h", "v"}]), Tgt]),
    out("v4_path_ab", [U, S("http://host/a/b/"), Tgt]),
    out("v4_user", [U, ep("http://host/", "user", []), Tgt]),
    out("v4_user_port3", [U, ep("http://host:3/", "user", []), Tgt]),
    out("v4_user3", [U, ep("http://host/", "user3", []), Tgt]),
    out("v4_user2_hv", [U, ep("http://host/", "user2", [{"h", "v"}]), Tgt]),
    out("v4_user_hv", [U, ep("http://host/", "user", [{"h", "v"}]), Tgt]),
    %% options and filters (couch_replicator_ids:maybe_append_filters/2)
    Src = S("http://127.0.0.1:5984/source/"),
    Base = [U, Src, Tgt],
    out("plain", Base),
    out("other_uuid", [<<"another-server-uuid">>, Src, Tgt]),
    out("https_8443_query", [U, S("https://example.org:8443/db?x=1"), Tgt]),
    out("ipv6", [U, S("http://[::1]:15984/db/"), Tgt]),
    out("doc_ids", Base ++ [[<<"a b">>, <<"a/b">>, <<"c">>, <<16#c3, 16#bc>>]]),
    out("filter_user", Base ++ [<<"function(doc, req) { return doc.type === req.query.t; }">>,
                                {[{<<"t">>, <<"x">>}]}]),
    out("filter_user_noqp", Base ++ [<<"function(doc) { return true; }">>, {[]}]),
    out("filter_view", Base ++ [<<"_view">>, {[{<<"view">>, <<"d/v">>}, {<<"n">>, 1}]}]),
    out("filter_doc_ids_builtin", Base ++ [<<"_design">>, {[]}]),
    out("selector_eq", Base ++ [{[{<<"type">>, {[{<<"$eq">>, <<"a">>}]}}]}]),
    out("selector_and_nested", Base ++ [{[{<<"$and">>, [
        {[{<<"a.b">>, {[{<<"$gt">>, 5}]}}]},
        {[{<<"c">>, {[{<<"$eq">>, true}]}}]}]}]}]),
    out("selector_not", Base ++ [{[{<<"n">>, {[{<<"$lte">>, 10}]}}]}]),
    out("winning_revs_only", Base ++ [<<"winning_revs_only">>]),
    out("since_seq_int", Base ++ [42]),
    out("since_seq_str", Base ++ [<<"42-g1AAAA">>]),
    out("since_seq_big", Base ++ [12345678901234567890]),
    out("winning_and_since", Base ++ [<<"winning_revs_only">>, 7]),
    halt().
