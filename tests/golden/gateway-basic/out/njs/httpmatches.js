// gwpolicy: header, query and method matches of HTTPRoute rules, for njs 0.7.9.
// The table (matches.json, loaded with js_preload_object as `gwmatches`) maps a location's key
// ($gw_match) to its candidate rules in the Gateway API precedence order; the first rule whose
// conditions all hold wins and the request goes to that rule's named location. No rule -> 404.
// njs 0.7 style: no for..of, no destructuring, no prototype methods on the preloaded data.
var regexps = {};

function regexp(src) {
    var re = regexps[src];
    if (re === undefined) {
        re = new RegExp(src);
        regexps[src] = re;
    }
    return re;
}

function valueMatches(cond, value) {
    if (value === undefined || value === null) {
        return false;
    }
    if (cond[0] === 'RegularExpression') {
        return regexp(cond[2]).test(value);
    }
    return value === cond[2];
}

function firstValue(v) {
    if (v !== undefined && v !== null && typeof v === 'object') {
        return v[0];
    }
    return v;
}

function ruleMatches(r, rule) {
    var i;
    if (rule.m && r.method !== rule.m) {
        return false;
    }
    var headers = rule.h;
    for (i = 0; i < headers.length; i++) {
        if (!valueMatches(headers[i], r.headersIn[headers[i][1]])) {
            return false;
        }
    }
    var params = rule.q;
    for (i = 0; i < params.length; i++) {
        if (!valueMatches(params[i], firstValue(r.args[params[i][1]]))) {
            return false;
        }
    }
    return true;
}

function go(r, target) {
    if (typeof target === 'string') {
        r.internalRedirect(target);
        return;
    }
    // weighted backends with different settings: [[weight, location], ...]
    var total = 0;
    var i;
    for (i = 0; i < target.length; i++) {
        total += target[i][0];
    }
    var x = Math.random() * total;
    for (i = 0; i < target.length; i++) {
        x -= target[i][0];
        if (x < 0) {
            r.internalRedirect(target[i][1]);
            return;
        }
    }
    r.internalRedirect(target[target.length - 1][1]);
}

function dispatch(r) {
    var list = gwmatches[r.variables.gw_match];
    if (list === undefined) {
        r.return(500);
        return;
    }
    for (var i = 0; i < list.length; i++) {
        if (ruleMatches(r, list[i])) {
            go(r, list[i].t);
            return;
        }
    }
    r.return(404);
}

export default {dispatch: dispatch};
